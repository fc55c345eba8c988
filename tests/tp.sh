#!/usr/bin/env bash
# tests/tp.sh - tensor parallelism (issue 4): the tiny GPT-2 and the small
# Llama-style model on the tp axis, alone and composed with the data-parallel
# axes, compute the same mathematics as one rank with the whole global batch.
#
# Runs (each STEPS steps of models/gpt2-tiny.dp on a byte-level shard of the
# GPL-3 text, reference: 1 rank, ddp):
#   - tp=2                          (2 ranks)
#   - tp=2 x dp_shard=2, ddp        (4 ranks; rank = s*2 + t), also with
#     buckets of 10 KB
#   - tp=2 x dp_shard=2, full_shard (4 ranks: FSDP + TP, 2-D)
#   - tp=2 x dp_replicate=2 x dp_shard=2, hybrid_shard (8 ranks, 3-D)
#   - tp=2 x dp_shard=2, per-block strategies: full_shard layers without
#     resharding, a ddp embedding, a zero2 final norm (4 ranks)
#   - full_shard at 4 ranks (no tp)
#   - models/llama.dp at tp=2 against its own 1-rank run
#   - scalar operands (scale, add_scalar) on the column-split MLP activation
#     and on the replicated attention output, at tp=2 against their 1-rank run
# Losses (rtol 1e-5) and the final parameters (--save-full: the EXPORT
# program gathers the tp blocks back into whole tensors; atol 1e-6 + rtol
# 1e-4) must match. Measured: ~1e-7 (float sums split differently across
# ranks). A run with a 10% different learning rate is rejected (the check
# can fail).
#
# --stats: the tp_reduce row equals its closed form, 4 all-reduces per layer
# per micro-batch (attention and MLP outputs forward, their column-parallel
# input gradients backward) of B*T*d f32 each, bus factor 2(n-1)/n.
set -u
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
T=$(tmpdir)
trap 'rm -rf "$T"' EXIT
STEPS=${STEPS:-8}

text_shard
gpt=$T/gpt.dp
variant models/gpt2-tiny.dp "$gpt" "$data"
mesh() { # mesh DST MESH-LINE [STRATEGY] [SRC]: SRC (the gpt) on that mesh
	local src=${4:-$gpt}
	{ echo "mesh $2"; grep -v '^mesh ' "$src"; } |
		sed -e "s/^  strategy .*/  strategy ${3:-ddp}/" >"$1"
	grep -q "^mesh $2\$" "$1" || fail "mesh line of $1"
}
ref() { once gpt-1 eq_run gpt-1 1 "$gpt"; } # the 1-rank run every gpt2-tiny case matches
if case_on gpt-1; then
	ref
	if awk '/^#/ {next} !n++ {a=$2} END{exit !($2 < a)}' "$T/gpt-1.loss" 2>/dev/null; then
		ok "gpt2-tiny: loss falls at 1 rank"
	else
		fail "gpt2-tiny: loss falls at 1 rank"
	fi
fi
# tp_case NAME NP: run $T/NAME.dp on NP ranks; it matches the 1-rank run
tp_case() {
	case_on "$1" || return 0
	ref
	eq_run "$1" "$2" "$T/$1.dp" && eq_same "$1" gpt-1
}

mesh "$T/tp2.dp" "tp=2"
grep -q "^  strategy ddp" "$gpt" || fail "gpt2-tiny's strategy is ddp (the reference)"
tp_case tp2 2
mesh "$T/tp2dp2.dp" "tp=2, dp_shard=2"
tp_case tp2dp2 4
# small ddp buckets: some hold only tp-split weights (their 1-D view is
# shard0 on tp, whatever dim the first weight is split on)
variant "$T/tp2dp2.dp" "$T/tp2b.dp" 's/^  strategy ddp/&\n  bucket_mb 0.01/'
tp_case tp2b 4
mesh "$T/tp2fs2.dp" "tp=2, dp_shard=2" full_shard
tp_case tp2fs2 4
mesh "$T/tp2hs.dp" "dp_replicate=2, dp_shard=2, tp=2" hybrid_shard
tp_case tp2hs 8
mesh "$T/fs4.dp" "dp_shard=4" full_shard
tp_case fs4 4
# per-block strategies under tp: the embedding (and the tied head weight)
# ddp, the final norm zero2, the layers full_shard without resharding; the
# norm weights the ddp unit 1/(dp_shard*tp)
variant "$T/tp2fs2.dp" "$T/tp2mix.dp" 's/^  block embed {/&\n    strategy ddp/' \
	's/^  block lnf {/&\n    strategy zero2/' 's/^    block h\[i\] {/&\n      reshard_after_forward false/'
tp_case tp2mix 4

# the comparison can fail: 10% more learning rate at tp=2
variant "$T/tp2.dp" "$T/tp2lr.dp" 's/lr=\([0-9.e-]*\)/lr=\1*1.1/'
if case_on tp2lr; then
	ref
	if eq_run tp2lr 2 "$T/tp2lr.dp" &&
		! $PY tests/compare.py losses "$T/tp2lr.loss" "$T/gpt-1.loss" --rtol 1e-5 --atol 0 >/dev/null; then
		ok "a 10% different lr at tp=2 is rejected"
	else
		fail "a 10% different lr at tp=2 is rejected"
	fi
fi

# llama: rmsnorm, rope, swiglu under tp
llama=$T/llama.dp
variant models/llama.dp "$llama" "$data"
mesh "$T/llama-tp2.dp" "tp=2" ddp "$llama"
if case_on llama-tp2; then
	eq_run llama-1 1 "$llama"
	eq_run llama-tp2 2 "$T/llama-tp2.dp" && eq_same llama-tp2 llama-1
fi

# scalar operands are elementwise (TP LOCAL): on a column-split activation
# each rank scales and shifts its own columns
scalar_variant "$gpt" "$T/scalar.dp"
mesh "$T/scalar-tp2.dp" "tp=2" ddp "$T/scalar.dp"
if case_on scalar-tp2; then
	eq_run scalar-1 1 "$T/scalar.dp"
	eq_run scalar-tp2 2 "$T/scalar-tp2.dp" && eq_same scalar-tp2 scalar-1
fi

# --stats: tp_reduce bytes per step against the closed form, and the
# figures for tp=2 vs dp=2
if ! case_on stats; then
	:
elif "$DPC" "$T/tp2.dp" --world-size 2 --emit=stats >"$T/tp2.stats" 2>&1 &&
	"$DPC" "$gpt" --world-size 2 --emit=stats >"$T/dp2.stats" 2>&1; then
	if $PY - "$T/tp2.dp" "$T/tp2.stats" <<'EOF'; then
import re, sys
src, stats = open(sys.argv[1]).read(), open(sys.argv[2]).read()
def num(pat):
    m = re.search(pat, src, re.M)
    return int(m.group(1)) if m else None
d, ctx, L = num(r"^\s*d\s*=\s*(\d+)"), num(r"^\s*ctx\s*=\s*(\d+)"), num(r"^\s*layers\s*=\s*(\d+)")
accum = num(r"^\s*grad_accum\s+(\d+)") or 1
mb, gb = num(r"^\s*micro_batch\s+(\d+)"), num(r"^\s*global_batch\s+(\d+)")
B = mb if mb else gb // accum  # tp=2: one data-parallel rank
row = [l.split() for l in stats.splitlines() if l.startswith("tp_reduce ")]
if not row:
    sys.exit("no tp_reduce row")
calls = float(row[0][3])
nbytes = float(re.sub(r"[^0-9.]", "", row[0][5]))
bus = float(re.sub(r"[^0-9.]", "", row[0][8]))
want_calls = 4 * L * accum
want_bytes = want_calls * B * ctx * d * 4
print("      tp_reduce: %g calls (want %d), %g bytes (want %d), bus %g (want %g)" %
      (calls, want_calls, nbytes, want_bytes, bus, want_bytes))
sys.exit(0 if calls == want_calls and nbytes == want_bytes and bus == want_bytes else 1)
EOF
		ok "tp_reduce row of --stats = its closed form"
	else
		fail "tp_reduce row of --stats = its closed form"; cat "$T/tp2.stats"
	fi
	echo "      tp=2 vs dp=2 (--stats, per rank per optimizer step):"
	grep -E "^(tp_reduce|all_reduce|total) " "$T/tp2.stats" | sed 's/^/      tp=2  /'
	grep -E "^(all_reduce|total) " "$T/dp2.stats" | sed 's/^/      dp=2  /'
else
	fail "--stats for tp=2 and dp=2"
fi
finish tp
