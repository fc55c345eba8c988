#!/usr/bin/env bash
# tests/roofline.sh - `dpc --stats --device h100` (passes/roofline.c): the
# step's roofline time per kernel class from H100's published peaks, and
# the MFU it predicts, checked against what must hold of a roofline:
#  - gemm's units follow the operands (f32: the CUDA cores; bf16 or
#    gemm_math tf32: tensor cores; GPT-2 124M's compute-bound GEMMs take
#    the rates' ratio less time in tf32 than in f32, and its attention runs
#    on tensor cores at the tf32 rate, fewer FLOPs executed than in f32),
#    and its time lies between its FLOPs at
#    that rate and that plus its bytes at 3.35 TB/s (max(a, b) <= a + b),
#    never below either: a rate from the wrong row of the datasheet or a
#    node counted twice fails it;
#  - the classes' FLOPs add up to --stats's FLOPs of the optimizer step
#    (one rank, no collectives), micro-batches times grad_accum included;
#  - model FLOPs: the GEMMs' FLOPs less the gelu their fused epilogues
#    compute (passes/fuse.c; its own line; mlp: nothing else), plus PaLM's 12 T d
#    per token and layer for a transformer (gpt2-tiny: 12 x ctx x d x
#    layers x tokens, from its config), and the printed MFU is model FLOPs
#    over the total time at 989.4 TFLOP/s; attention on tensor cores
#    predicts a higher MFU than on the CUDA cores;
#  - gpt2-tiny and GPT-2 124M: the residual adds folded into layernorms
#    (add_layernorm, layernorm_grad_add) 2 of each per layer and
#    micro-batch, the line --stats prints; llama the same with rmsnorms
#    (add_rmsnorm, rmsnorm_grad_add);
#  - the micro-batch that fits the device's memory (80 GiB) or
#    --device-memory (compiler/fit.c): it compiles within the budget, and
#    one more is refused as over it;
#  - an unknown --device is one line naming the known ones, exit 1.
set -u
. "$(dirname "$0")/lib.sh"
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
cd "$ROOT"

# roof NAME MODEL ARGS...: the --stats output into $T/NAME.txt
roof() {
	local name=$1 model=$2; shift 2
	"$DPC" "$model" --stats --device h100 "$@" >"$T/$name.txt" 2>"$T/$name.err" ||
		{ fail "$name: dpc --stats --device h100 $*"; head -n 3 "$T/$name.err"; return 1; }
}
# check NAME UNITS ATTN: the properties in the header (ATTN: 12 T d x layers x
# tokens of model FLOPs beyond the GEMMs', or 0)
check() {
	$PY - "$T/$1.txt" "$2" "$3" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
units, attn = sys.argv[2], float(sys.argv[3])
BF16, TF32, FP32, BW = 989.4e12, 494.7e12, 66.9e12, 3.35e12
def num(s):
    v, u = s.split()
    k = {"FLOP": 1, "kFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12, "PFLOP": 1e15,
         "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}[u]
    return float(v) * k
rows = {}
for m in re.finditer(r"^(gemm|attention|memory-bound|optimizer|total)\s+(\d+)\s+([\d.]+ \w+)\s+([\d.]+ \w+)\s+(\S*)\s+([\d.]+)$", text, re.M):
    rows[m.group(1)] = (int(m.group(2)), num(m.group(3)), num(m.group(4)), m.group(5), float(m.group(6)))
assert set(rows) >= {"gemm", "attention", "memory-bound", "optimizer", "total"}, rows
n, fl, by, u, ms = rows["gemm"]
assert u == units, ("gemm units", u, units)
rate = {"cuda": FP32, "tensor": BF16}[u]
lo, hi = 1e3 * fl / rate, 1e3 * (fl / rate + by / BW)
assert lo * 0.99 <= ms <= hi * 1.01 + 1e-3 and ms >= 1e3 * by / BW * 0.99, ("gemm ms", ms, lo, hi)
step = num(re.search(r"^optimizer step \(.*?\)\s+\d+ \(([\d.]+ \w+)\)", text, re.M).group(1))
tot = rows["total"][1]
assert abs(tot - step) <= 0.01 * step, ("total flops", tot, "stats", step)
model = num(re.search(r"^model flops ([\d.]+ \w+)", text, re.M).group(1))
epi = re.search(r"^gemm epilogue flops ([\d.]+ \w+)", text, re.M)
want = fl - (num(epi.group(1)) if epi else 0) + attn
assert abs(model - want) <= 0.01 * want, ("model flops", model, want)
mfu = [float(x) for x in re.findall(r"^predicted MFU ([\d.]+) %", text, re.M)]
total = rows["total"][4]
exp = 100 * model / (total * 1e-3 * BF16)
# the printed MFU has one decimal, the printed ms four
assert mfu and abs(mfu[0] - exp) <= 0.051 + exp * 0.00005 / total, ("MFU", mfu, exp)
if attn:
    assert len(mfu) == 2 and mfu[1] >= mfu[0], ("MFU with attention on tensor cores", mfu)
    tc = float(re.search(r"attention on tensor cores \(([\d.]+) ms\)", text).group(1))
    # (printed with 3 decimals: equal to the row's when it runs there already)
    assert tc <= rows["attention"][4] + 0.00051, ("attention on tensor cores", tc, rows["attention"])
    gain = rows["attention"][4] - tc  # the MFU rises where that is not lost in the rounding
    assert gain < 0.01 * total or mfu[1] > mfu[0], ("MFU with attention on tensor cores", mfu, gain)
print(f"gemm {ms:.4f} ms in [{lo:.4f}, {hi:.4f}], flops {tot:.4g} = stats {step:.4g}, model {model:.4g}, MFU {mfu} %")
EOF
}

if case_on "mlp f32: CUDA cores"; then
	roof mlp models/mlp.dp --world-size 1 && check mlp cuda 0 >"$T/mlp.out" 2>&1 &&
		ok "mlp f32: $(cat "$T/mlp.out")" || { fail "mlp f32"; cat "$T/mlp.out"; }
fi
if case_on "mlp bf16: tensor cores"; then
	roof mlp16 models/mlp.dp --world-size 1 --precision bf16 && check mlp16 tensor 0 >"$T/mlp16.out" 2>&1 &&
		ok "mlp bf16: $(cat "$T/mlp16.out")" || { fail "mlp bf16"; cat "$T/mlp16.out"; }
fi
if case_on "gpt2 tf32: tensor cores"; then
	# gemm_math tf32 runs f32 operands on tensor cores at 494.7 TFLOP/s: GPT-2
	# 124M's GEMMs are compute-bound, 494.7 / 66.9 faster than in f32; its
	# attention runs on the mma .tf32 kernels, priced at their executed
	# FLOPs at the tf32 rate: paired, FlashAttention-2's 2 + 5 causal
	# products (k_attn_bwd_mma: S and dP once for dK, dV and dQ), against
	# the CUDA-core kernels' 2 + 9 in f32 (the forward again, then S and dP
	# by query tile and by key tile)
	roof gpt2 models/gpt2.dp --world-size 1 && roof gpt2tf models/gpt2.dp --world-size 1 --set train.precision=tf32 &&
		$PY - "$T/gpt2.txt" "$T/gpt2tf.txt" >"$T/tf32.out" 2>&1 <<'EOF' &&
import re, sys
def gemm(p):
    return re.search(r"^gemm\s+\d+\s+\S+ \S+\s+\S+ \S+\s+(\S+)\s+([\d.]+)$", open(p).read(), re.M).groups()
u32, ms32 = gemm(sys.argv[1])
u, ms = gemm(sys.argv[2])
r = float(ms32) / float(ms)
assert u32 == "cuda" and u == "tensor" and 0.9 * 494.7 / 66.9 < r <= 494.7 / 66.9 * 1.01, (u32, u, ms32, ms, r)
def attn(p):
    t = open(p).read()
    by, unit, ms = re.search(r"^attention\s+\d+\s+\S+ \S+\s+([\d.]+) GiB\s+(\S+)\s+([\d.]+)$", t, re.M).groups()
    run = re.search(r"^attention executes ([\d.]+) GFLOP on (\S+) cores", t, re.M).groups()
    return float(by) * 2**30, unit, float(ms), float(run[0]) * 1e9, run[1]
_, au32, ams32, run32, on32 = attn(sys.argv[1])
by, au, ams, run, on = attn(sys.argv[2])
lo, hi = 1e3 * run / 494.7e12, 1e3 * (run / 494.7e12 + by / 3.35e12)
assert au32 == "cuda" and on32 == "CUDA" and au == "tensor" and on == "tensor", (au32, on32, au, on)
assert run < run32 and lo * 0.99 <= ams <= hi * 1.01, ("tf32 attention", run, run32, ams, lo, hi)
assert abs(run / run32 - 7 / 11) < 1e-4, ("executed causal products, tensor cores : CUDA cores", run, run32)
print(f"gemm {ms} ms on tensor cores, {ms32} ms in f32 ({r:.2f}x; the rates' ratio is {494.7 / 66.9:.2f}); "
      f"attention {ams} ms in tf32 ({run / 1e9:.1f} GFLOP executed), {ams32} ms in f32 ({run32 / 1e9:.1f})")
EOF
		ok "gpt2 tf32: $(cat "$T/tf32.out")" || { fail "gpt2 tf32"; cat "$T/tf32.out"; }
fi
# fused NAME N [NORM]: the residual adds passes/fuse.c folded into
# layernorms (rmsnorms), N of each kind per step (a pre-LayerNorm GPT-2: per
# layer and micro-batch 2 add_layernorm, ln2's sum and the next ln1's or
# lnf's, and 2 layernorm_grad_add, ln1 and ln2 meeting the residual's
# gradient; Llama's norm2, the next norm1 or the final norm, and the
# same with rmsnorm)
fused() {
	local line norm=${3:-layernorm}
	line=$(grep "^residual adds in the $norm's pass " "$T/$1.txt")
	if [ "$line" = "residual adds in the $norm's pass $2 (add_$norm) + $2 (${norm}_grad_add): as many memory-bound kernels and passes over a row fewer" ]; then
		echo "$2 + $2 residual adds in the ${norm}s' pass"
	else
		echo "want $2 + $2 residual adds fused: '$line'"
		return 1
	fi
}
# fused_gb NAME N: the layernorms' gamma and beta gradients in one pass
# (passes/fuse.c's layernorm_grad_gb), N per step (GPT-2: 2 per layer and
# lnf's, per micro-batch); a model without layernorms (N 0) has no line
fused_gb() {
	local line
	line=$(grep "^layernorm gamma and beta gradients in one pass " "$T/$1.txt")
	if [ "$2" = 0 ] && [ -z "$line" ]; then
		echo "no layernorm_grad_gb"
	elif [ "$line" = "layernorm gamma and beta gradients in one pass $2 (layernorm_grad_gb): as many memory-bound kernels and reads of dy fewer" ]; then
		echo "$2 layernorm_grad_gb"
	else
		echo "want $2 layernorm_grad_gb: '$line'"
		return 1
	fi
}
# transformer MODEL NAME [NORM]: model FLOPs are the GEMMs' and 12 T d per
# token and layer, tokens = micro_batch x ctx x grad_accum (the config's
# ctx, d and layers; the batch sizes from --stats's header line)
transformer() {
	local model=$1 name=$2 norm=${3:-layernorm} ctx d layers mb ga
	eval "$(sed -n 's/^  \(ctx\|d\|layers\) = \([0-9]*\).*/\1=\2/p' "$model" | tr '\n' ' ')"
	"$DPC" "$model" --stats >"$T/$name.0" 2>/dev/null
	mb=$(sed -n 's/.*micro_batch \([0-9]*\) x grad_accum.*/\1/p' "$T/$name.0")
	ga=$(sed -n 's/.*x grad_accum \([0-9]*\),.*/\1/p' "$T/$name.0")
	roof "$name" "$model" --world-size 1 --precision bf16 &&
		check "$name" tensor $((12 * ctx * d * layers * mb * ctx * ga)) >"$T/$name.out" 2>&1 &&
		fused "$name" $((2 * layers * ga)) "$norm" >>"$T/$name.out" 2>&1 &&
		fused_gb "$name" $([ "$norm" = layernorm ] && echo $(((2 * layers + 1) * ga)) || echo 0) \
			>>"$T/$name.out" 2>&1 &&
		ok "$name bf16 (ctx $ctx, d $d, $layers layers, micro_batch $mb x grad_accum $ga): $(tr "\n" " " <"$T/$name.out")" ||
		{ fail "$name bf16"; cat "$T/$name.out"; }
}
case_on "gpt2-tiny bf16: attention's model FLOPs" && transformer models/gpt2-tiny.dp gpt2-tiny
case_on "llama bf16: attention's model FLOPs, rmsnorm's residual adds" &&
	transformer models/llama.dp llama rmsnorm
# fit NAME MODEL ARGS...: the micro-batch --stats says fits (compiler/fit.c)
# is what dpc's own budget check says of it: the step compiled at that
# micro-batch (global_batch = it x grad_accum x dp ranks) within the budget,
# at one more over it (exit 1, "over --device-memory")
fit() {
	local name=$1 model=$2 budget=$3 world=$4 line m ga dp; shift 4
	"$DPC" "$model" --world-size "$world" --stats --device h100 ${budget:+--device-memory "$budget"} "$@" \
		>"$T/$name.fit" 2>/dev/null
	line=$(grep "^micro-batch that fits " "$T/$name.fit")
	m=$(sed -n 's/.*: \([0-9]*\) per rank (.*/\1/p' <<<"$line")
	ga=$(sed -n 's/.*x grad_accum \([0-9]*\),.*/\1/p' "$T/$name.fit")
	dp=$(sed -n 's/.*mesh dp_replicate=\([0-9]*\) dp_shard=\([0-9]*\) .*/\1 * \2/p' "$T/$name.fit")
	[ -n "$m" ] && [ -n "$ga" ] && [ -n "$dp" ] || { echo "no micro-batch line: '$line'"; return 1; }
	"$DPC" "$model" --world-size "$world" "$@" --set train.global_batch=$((m * ga * dp)) \
		--device-memory "${budget:-80GiB}" -o "$T/$name.bin" >/dev/null 2>&1 ||
		{ echo "$line; but $m does not compile within the budget"; return 1; }
	if "$DPC" "$model" --world-size "$world" "$@" --set train.global_batch=$(((m + 1) * ga * dp)) \
		--device-memory "${budget:-80GiB}" -o "$T/$name.bin" >"$T/$name.over" 2>&1 ||
		! grep -q "over --device-memory" "$T/$name.over"; then
		echo "$line; but $((m + 1)) is not refused as over the budget"
		return 1
	fi
	echo "$line"
}
if case_on "micro-batch fit"; then
	for c in "gpt2 models/gpt2.dp '' 1 --precision bf16" "gpt2-tiny models/gpt2-tiny.dp 6MiB 1" \
		"llama models/llama.dp 30MiB 2"; do
		eval "fit $c" >"$T/fit.out" 2>&1 && ok "micro-batch fit, ${c%% *}: $(cat "$T/fit.out")" ||
			{ fail "micro-batch fit, ${c%% *}"; cat "$T/fit.out"; }
	done
fi
case_on "gpt2 bf16: attention's model FLOPs, tensor-core attention" && transformer models/gpt2.dp gpt2
# attention at GPT-2 124M's shapes: the kernels' executed FLOPs in causal
# products of T x T x hd per sequence, head and layer: in bf16 (head dim 64)
# 7 on tensor cores (the forward's 2, the one-kernel backward's 5,
# FlashAttention-2's: every gradient is paired with its forward, whose
# output is intact until then), in f32 11 on
# the CUDA cores (the backward's 9); its time between those FLOPs at that
# rate and that plus its bytes
if case_on "gpt2 attention: executed FLOPs on their units"; then
	eval "$(sed -n 's/^  \(ctx\|d\|layers\) = \([0-9]*\).*/\1=\2/p' models/gpt2.dp | tr '\n' ' ')"
	"$DPC" models/gpt2.dp --stats >"$T/att.0" 2>/dev/null
	mb=$(sed -n 's/.*micro_batch \([0-9]*\) x grad_accum.*/\1/p' "$T/att.0")
	ga=$(sed -n 's/.*x grad_accum \([0-9]*\),.*/\1/p' "$T/att.0")
	# shellcheck disable=SC2154
	roof att16 models/gpt2.dp --world-size 1 --precision bf16 &&
		roof att32 models/gpt2.dp --world-size 1 --precision f32 &&
		$PY - "$T/att16.txt" "$T/att32.txt" $((mb * ga * ctx * ctx * d * layers)) >"$T/att.out" 2>&1 <<'EOF' &&
import re, sys
BF16, FP32, BW = 989.4e12, 66.9e12, 3.35e12
def num(s):
    v, u = s.split()
    return float(v) * {"GFLOP": 1e9, "TFLOP": 1e12, "MiB": 2**20, "GiB": 2**30}[u]
unit = float(sys.argv[3])  # sequences x T x T x hd x heads x layers per step
out = []
for path, units, rate, k in ((sys.argv[1], "tensor", BF16, 7), (sys.argv[2], "cuda", FP32, 11)):
    text = open(path).read()
    row = re.search(r"^attention\s+\d+\s+([\d.]+ \w+)\s+([\d.]+ \w+)\s+(\S+)\s+([\d.]+)$", text, re.M)
    ex = re.search(r"^attention executes ([\d.]+ \w+) on (.*?), its ms", text, re.M)
    by, u, ms = num(row.group(2)), row.group(3), float(row.group(4))
    run = num(ex.group(1))
    where = {"tensor": "tensor cores", "cuda": "CUDA cores"}[units]
    assert u == units and ex.group(2) == where, (path, u, ex.group(2))
    assert abs(run - k * unit) <= 0.01 * k * unit, (path, "executed", run, k * unit)
    lo, hi = 1e3 * run / rate, 1e3 * (run / rate + by / BW)
    assert lo * 0.99 <= ms <= hi * 1.01, (path, "attention ms", ms, lo, hi)
    out.append(f"{units} {run / 1e9:.1f} GFLOP in {ms:.3f} ms")
print(", ".join(out))
EOF
		ok "gpt2 attention: $(cat "$T/att.out")" || { fail "gpt2 attention"; cat "$T/att.out"; }
fi
# ... and at cp=2 (a rank's ctx/2 queries against the gathered ctx keys):
# 2 + 5 such products on tensor cores in bf16 (the two cp gradients one
# attention_cp_grad_both, passes/fuse.c, paired with its forward; 2 + 3 + 4
# as two ops, 2 + 5 + 6 on the CUDA cores before they ran there)
if case_on "gpt2 cp=2 attention: executed FLOPs on tensor cores"; then
	eval "$(sed -n 's/^  \(ctx\|d\|layers\) = \([0-9]*\).*/\1=\2/p' models/gpt2.dp | tr '\n' ' ')"
	{ echo "mesh cp=2"; grep -v '^mesh ' models/gpt2.dp; } >"$T/gpt2cp.dp"
	"$DPC" "$T/gpt2cp.dp" --world-size 2 --stats >"$T/attcp.0" 2>/dev/null
	mb=$(sed -n 's/.*micro_batch \([0-9]*\) x grad_accum.*/\1/p' "$T/attcp.0")
	ga=$(sed -n 's/.*x grad_accum \([0-9]*\),.*/\1/p' "$T/attcp.0")
	# shellcheck disable=SC2154
	roof attcp "$T/gpt2cp.dp" --world-size 2 --precision bf16 &&
		$PY - "$T/attcp.txt" $((mb * ga * ctx / 2 * ctx * d * layers)) >"$T/attcp.out" 2>&1 <<'EOF' &&
import re, sys
ex = re.search(r"^attention executes ([\d.]+) GFLOP on tensor cores,", open(sys.argv[1]).read(), re.M)
unit = float(sys.argv[2])
assert ex and abs(float(ex.group(1)) * 1e9 - 7 * unit) <= 0.01 * 7 * unit, (ex and ex.group(1), 7 * unit)
print(f"{ex.group(1)} GFLOP on tensor cores = 7 x {unit / 1e9:.2f} GFLOP")
EOF
		ok "gpt2 cp=2 attention: $(cat "$T/attcp.out")" || { fail "gpt2 cp=2 attention"; cat "$T/attcp.out"; }
fi
if case_on "unknown device"; then
	"$DPC" models/mlp.dp --stats --device a100 >"$T/dev.out" 2>"$T/dev.err"
	rc=$?
	if [ $rc = 1 ] && [ "$(wc -l <"$T/dev.err")" = 1 ] && grep -q "unknown --device 'a100' (h100)" "$T/dev.err" &&
		[ ! -s "$T/dev.out" ]; then
		ok "unknown --device: $(cat "$T/dev.err")"
	else
		fail "unknown --device: exit $rc: $(cat "$T/dev.err")"
	fi
fi
finish roofline
