#!/usr/bin/env bash
# bench/gpt_cpu.sh - training throughput of a GPT on the CPU: dp against PyTorch
# eager, side by side, in one run.
#
# Model: models/gpt2-tiny.dp at -D d=256 -D heads=4 -D layers=4 -D ctx=128
# (vocab 256), global batch 16 x 128 = 2048 tokens per optimizer step, AdamW,
# clip_grad_norm 1.0. The anchor is bench/gpt_cpu.py: the same model written
# the way a PyTorch user writes it (Debian's python3-torch 1.13, eager, fp32;
# manual causal attention over the T x T scores, tanh GELU, torch.optim.AdamW,
# clip_grad_norm_), on one fixed in-memory batch (dp reads and samples its
# token shard every step: that cost is dp's alone).
#
# Three configurations, each side given the same cores:
#   1 rank  x 1 thread : dp DP_NUM_THREADS=1;  torch set_num_threads(1)
#   1 rank  x 2 threads: dp DP_NUM_THREADS=2;  torch set_num_threads(2)
#   2 ranks x 1 thread : mpirun -np 2 of each; dp's MPI all-reduce, torch DDP
#                        over gloo (mpirun binds each rank to a core for both)
# OPENBLAS_NUM_THREADS is the thread count on both sides: Debian's OpenBLAS
# is the pthread build, which torch.set_num_threads does not limit (without
# it PyTorch's GEMMs would quietly use every core). dp runs OpenBLAS on one
# thread and splits GEMMs over its own threads.
#
# Rounds are interleaved (dp, torch, dp, torch, ... for every configuration,
# ROUNDS times) so that a change in the machine's load hits both sides; each
# run reports its mean ms/step over STEPS steps after WARMUP, and the table
# shows the median over the rounds. Peak RSS: GNU time's maximum resident
# set of the largest process (for 2 ranks, of the largest rank), measured the
# same way for both.
#
# OpenBLAS's kernels: where dp picks other kernels than OpenBLAS's default
# (Haswell's on AMD Zen 4), PyTorch also runs at 1 x 1 with dp's kernels,
# printed as a second anchor row. After the table, a traced dp run says
# where its 1-thread step goes (the GEMMs, attention, the rest) and what
# ratio the GEMMs alone would allow.
#
# Then one optimizer step of models/gpt2.dp (124M parameters, ctx 1024,
# global batch 8 in 2 micro-batches) at 1 rank x 1 thread against PyTorch on
# the same shapes: GPT2_STEPS steps each (default 2), the last one timed, the
# first warms the memory. Minutes per side; GPT2=0 skips it.
#
#   bash bench/gpt_cpu.sh                          # ~10 min on 2 cores
#   ROUNDS=5 STEPS=20 GPT2=0 bash bench/gpt_cpu.sh
# Not a test: it needs a quiet machine to mean anything.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-2}
GPT2=${GPT2:-1}
GPT2_STEPS=${GPT2_STEPS:-2}
PY=/usr/bin/python3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

for tool in "$BUILD/dpc" "$BUILD/dpexec" "$BUILD/text2shard"; do
	[ -x "$tool" ] || { echo "gpt_cpu: $tool is missing: run make" >&2; exit 1; }
done
$PY -c "import torch" 2>/dev/null || { echo "gpt_cpu: needs python3-torch (make deps)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "gpt_cpu: needs GNU time (/usr/bin/time)" >&2; exit 1; }

# Byte-level token shard: the fortunes text as make demo-gpt uses it, else the GPL.
texts=()
for f in cookie computers definitions education humorists literature people science wisdom work; do
	[ -f "/usr/share/games/fortunes/$f" ] && texts+=("/usr/share/games/fortunes/$f")
done
[ ${#texts[@]} -gt 0 ] || texts=(/usr/share/common-licenses/GPL-3)
"$BUILD/text2shard" -o "$T/train.bin" "${texts[@]}" >/dev/null

# model_copy SRC DST: SRC reading $T/train.bin, without its eval block (dpexec
# would evaluate the whole split at the end)
model_copy() {
	sed -e '/^eval {/,/^}/d' -e "s#tokens(\"build/data/[a-z_]*\.bin\"#tokens(\"$T/train.bin\"#" "$1" >"$2"
	grep -q "$T/train.bin" "$2" || { echo "gpt_cpu: cannot point $1 at the shard" >&2; exit 1; }
}
model_copy models/gpt2-tiny.dp "$T/tiny.dp"
TINY="-D d=256 -D heads=4 -D layers=4 -D ctx=128"
"$BUILD/dpc" "$T/tiny.dp" $TINY -o "$T/tiny1.bin"
"$BUILD/dpc" "$T/tiny.dp" $TINY --world-size 2 -o "$T/tiny2.bin"
TORCH_TINY="--vocab 256 --ctx 128 --d 256 --heads 4 --layers 4 --global-batch 16"
TOKENS=2048

# peak RSS in MiB from GNU time's output file
rss_of() { awk '/^maxrss_kb/ {printf "%.1f", $2 / 1024}' "$1"; }
# dp_run NP THREADS BIN STEPS WARMUP: appends "ms rss_mib" to $RES
dp_run() {
	local np=$1 th=$2 bin=$3 steps=$4 warm=$5 out=$T/dp.out
	local run=("$BUILD/dpexec" "$bin" --no-timestamps --steps $((steps + warm)) --log-every 1)
	[ "$np" -gt 1 ] && run=(mpirun --oversubscribe -np "$np" "${run[@]}")
	if ! env DP_NUM_THREADS="$th" OPENBLAS_NUM_THREADS="$th" /usr/bin/time -f "maxrss_kb %M" \
		-o "$T/dp.time" "${run[@]}" >"$out" 2>&1; then
		echo "gpt_cpu: dp failed:" >&2; tail -n 20 "$out" >&2; exit 1
	fi
	local ms
	ms=$(sed -nE 's/^step ([0-9]+)\/[0-9]+ .*\| ([0-9.]+) ms\/step.*/\1 \2/p' "$out" |
		awk -v w="$warm" '$1 > w {s += $2; n++} END {if (n) printf "%.2f", s / n}')
	[ -n "$ms" ] || { echo "gpt_cpu: no step times in dp's output:" >&2; tail "$out" >&2; exit 1; }
	echo "$ms $(rss_of "$T/dp.time")" >>"$RES"
}
# torch_run NP THREADS STEPS WARMUP ARGS...: appends "ms rss_mib" to $RES
torch_run() {
	local np=$1 th=$2 steps=$3 warm=$4 out=$T/torch.out
	shift 4
	local run=($PY bench/gpt_cpu.py --threads "$th" --steps "$steps" --warmup "$warm" "$@")
	[ "$np" -gt 1 ] && run=(mpirun --oversubscribe -np "$np" "${run[@]}")
	if ! env OPENBLAS_NUM_THREADS="$th" OMP_NUM_THREADS="$th" ${CORE:+OPENBLAS_CORETYPE=$CORE} \
		/usr/bin/time -f "maxrss_kb %M" \
		-o "$T/torch.time" "${run[@]}" >"$out" 2>&1; then
		echo "gpt_cpu: PyTorch failed:" >&2; tail -n 20 "$out" >&2; exit 1
	fi
	local ms
	ms=$(awk '/^ms_per_step/ {print $2}' "$out")
	[ -n "$ms" ] || { echo "gpt_cpu: no step time in PyTorch's output:" >&2; tail "$out" >&2; exit 1; }
	echo "$ms $(rss_of "$T/torch.time")" >>"$RES"
}

CONFIGS=("1 1" "1 2" "2 1") # ranks threads
# OpenBLAS's kernels: dp picks its own on some CPUs (Haswell's on AMD Zen 4:
# runtime/cpu/gemm.c, docs/PERF.md); PyTorch runs OpenBLAS's default. When
# they differ, PyTorch also runs at 1 x 1 with dp's choice, as a second
# anchor, so that the table shows what the kernels alone are worth.
DP_CORE=$("$BUILD/dpexec" "$T/tiny1.bin" --no-timestamps --steps 1 --verbose 2>/dev/null |
	sed -nE 's/^device: .*NO_AFFINITY ([A-Za-z0-9]+) .*/\1/p')
TORCH_CORE=$($PY -c 'import torch, ctypes; l = ctypes.CDLL("libopenblas.so.0"); l.openblas_get_corename.restype = ctypes.c_char_p; print(l.openblas_get_corename().decode())' 2>/dev/null)
echo "OpenBLAS kernels: dp ${DP_CORE:-?}, PyTorch ${TORCH_CORE:-?}"
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
	echo "  (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE in the environment chooses them for both sides;" \
		"unset it to measure the kernels OpenBLAS and dp pick for this CPU)"
fi
CORES_DIFFER=$([ -n "$DP_CORE" ] && [ "$DP_CORE" != "$TORCH_CORE" ] && echo 1 || true)
echo "gpt2-tiny (d=256, 4 layers, 4 heads, T=128, vocab 256), $TOKENS tokens per step;"
echo "$ROUNDS interleaved rounds of $STEPS timed steps after $WARMUP warm-up, per configuration and side"
for ((r = 1; r <= ROUNDS; r++)); do
	for c in "${CONFIGS[@]}"; do
		set -- $c
		RES=$T/dp_$1_$2 dp_run "$1" "$2" "$T/tiny$1.bin" "$STEPS" "$WARMUP"
		RES=$T/torch_$1_$2 torch_run "$1" "$2" "$STEPS" "$WARMUP" $TORCH_TINY
		echo "  round $r, $1 rank(s) x $2 thread(s): dp $(tail -n 1 "$T/dp_$1_$2" | cut -d' ' -f1) ms," \
			"PyTorch $(tail -n 1 "$T/torch_$1_$2" | cut -d' ' -f1) ms per step"
		if [ "$1 $2" = "1 1" ] && [ -n "$CORES_DIFFER" ]; then
			CORE=$DP_CORE RES=$T/torchk_1_1 torch_run 1 1 "$STEPS" "$WARMUP" $TORCH_TINY
			echo "    PyTorch with OpenBLAS's $DP_CORE kernels: $(tail -n 1 "$T/torchk_1_1" | cut -d' ' -f1) ms per step"
		fi
	done
done

median() { sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo
printf "%-20s %12s %14s %7s %13s %17s\n" "configuration" "dp tok/s" "PyTorch tok/s" "ratio" "dp peak RSS" "PyTorch peak RSS"
for c in "${CONFIGS[@]}"; do
	set -- $c
	dms=$(cut -d' ' -f1 "$T/dp_$1_$2" | median)
	tms=$(cut -d' ' -f1 "$T/torch_$1_$2" | median)
	drss=$(cut -d' ' -f2 "$T/dp_$1_$2" | median)
	trss=$(cut -d' ' -f2 "$T/torch_$1_$2" | median)
	awk -v n="$1 rank$([ "$1" = 1 ] || echo s) x $2 thread$([ "$2" = 1 ] || echo s)" -v d="$dms" \
		-v t="$tms" -v dr="$drss" -v tr="$trss" -v tok="$TOKENS" 'BEGIN {
		printf "%-20s %12.0f %14.0f %6.2fx %10.0f MiB %14.0f MiB\n", n, tok * 1000 / d,
			tok * 1000 / t, t / d, dr, tr }'
	if [ "$1 $2" = "1 1" ] && [ -n "$CORES_DIFFER" ]; then
		tms=$(cut -d' ' -f1 "$T/torchk_1_1" | median)
		awk -v n="  PyTorch, $DP_CORE" -v d="$dms" -v t="$tms" -v tok="$TOKENS" 'BEGIN {
			printf "%-20s %12s %14.0f %6.2fx   (PyTorch with dp'"'"'s OpenBLAS kernels)\n", n, "",
				tok * 1000 / t, t / d }'
	fi
done
echo "(ratio: dp tokens/s over PyTorch's; > 1: dp is faster)"

# Where dp's 1-thread step goes, from a --trace of it (runtime/trace.c): the
# matrix products (linear, matmul: OpenBLAS), attention (its tile products
# are OpenBLAS too), the rest; and the ratio dp would have if its step were
# its matrix products alone, against the same run's PyTorch median.
env DP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$BUILD/dpexec" "$T/tiny1.bin" --steps $((STEPS + WARMUP)) \
	--log-every $((STEPS + WARMUP)) --trace "$T/trace.json" >/dev/null 2>&1 ||
	{ echo "gpt_cpu: the traced dp run failed" >&2; exit 1; }
$PY - "$T/trace.json" "$WARMUP" "$(cut -d' ' -f1 "$T/torch_1_1" | median)" <<'EOF'
import collections, json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
warm, torch_ms = int(sys.argv[2]), float(sys.argv[3])
step = lambda e: e.get("args", {}).get("step", 0)
runs = [e for e in ev if e.get("cat") == "run" and e["name"].startswith("step ")
        and int(e["name"].split()[1]) > warm]
ms = collections.Counter()
for e in ev:
    if e.get("cat") == "kernel" and step(e) > warm:
        op = e["name"].split(" = ")[-1]
        ms["gemm" if op in ("linear", "matmul") else "attention" if op.startswith("attention") else "rest"] += e["dur"] / 1e3
n = len({e["name"].split()[1] for e in runs})
total = sum(e["dur"] for e in runs) / 1e3 / n
g, a, r = ms["gemm"] / n, ms["attention"] / n, ms["rest"] / n
print(f"\ndp's 1-thread step, traced ({n} steps): {total:.1f} ms = linear/matmul {g:.1f} ms "
      f"({100 * g / total:.0f}%), attention {a:.1f} ms ({100 * a / total:.0f}%), "
      f"the rest {total - g - a:.1f} ms")
print(f"  ratio if the step were its linear/matmul GEMMs alone: {torch_ms / g:.2f}x; "
      f"with attention too: {torch_ms / (g + a):.2f}x (PyTorch median {torch_ms:.1f} ms)")
EOF

[ "$GPT2" = 1 ] || exit 0
echo
echo "models/gpt2.dp (124M, ctx 1024, global batch 8 = 2 micro-batches of 4), 1 rank x 1 thread:"
model_copy models/gpt2.dp "$T/gpt2.dp"
"$BUILD/dpc" "$T/gpt2.dp" -o "$T/gpt2.bin"
w=$((GPT2_STEPS - 1))
RES=$T/gpt2_dp dp_run 1 1 "$T/gpt2.bin" 1 "$w"
RES=$T/gpt2_torch torch_run 1 1 1 "$w" --vocab 50257 --ctx 1024 --d 768 --heads 12 --layers 12 \
	--global-batch 8 --grad-accum 2
read -r d drss <"$T/gpt2_dp"
read -r t trss <"$T/gpt2_torch"
awk -v d="$d" -v t="$t" -v dr="$drss" -v tr="$trss" 'BEGIN {
	printf "  dp      %8.0f ms/step  %6.0f tokens/s  peak RSS %6.0f MiB\n", d, 8192 * 1000 / d, dr
	printf "  PyTorch %8.0f ms/step  %6.0f tokens/s  peak RSS %6.0f MiB\n", t, 8192 * 1000 / t, tr
	printf "  ratio   %.2fx (dp tokens/s over PyTorch'"'"'s)\n", t / d }'
