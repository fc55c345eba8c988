#!/usr/bin/env python3
"""tests/stats_forms.py - dpc's --emit=stats tables against closed forms.

  DPC=build/dpc stats_forms.py MODEL.dp...   (run by tests/sharding.sh)

For each model and strategy, at n = 1, 2 and 4 ranks, the collective table
(bytes and nccl-tests bus bytes per optimizer step and rank, calls, buckets)
must EQUAL the closed form computed here, and the memory table's parameter,
gradient and optimizer-state rows must fall as 1/n within a stated bound.
Prints one "  ok ..." or "  FAIL ..." line per check; exits 1 on any FAIL.

Independence: the parameter counts come from the model TEXT (the `param`
lines, parsed here by a regex, never from dpc's output), checked against the
hand-computed totals in KNOWN. Sizes are bytes, f32 = 4 bytes.

The closed forms (S(x) = 4 bytes * x elements, f = (n-1)/n with n the ranks
of the collective's group, A = grad_accum, U = the sharding units, x' = x
padded up to a multiple of dp_shard, per unit):
  bytes column = sum over calls of S (the full buffer), bus = factor * bytes
  (nccl-tests: all_reduce 2f, all_gather and reduce_scatter f).
  ddp           all_reduce(dp_replicate,dp_shard) S(P), unpadded: ddp's
                buckets are plain ranges of the flat gradients.
  zero1         all_reduce(dp_replicate,dp_shard) S(P')  [the padded units:
                dp reduces the unit buffers, pad included]
                + all_gather(dp_shard) S(P')
  zero2         reduce_scatter(dp_shard) S(P') + all_gather(dp_shard) S(P')
  full_shard    reshard_after_forward true (default):
                  A * (all_gather S(P') forward + all_gather S(P' - P'_first)
                  backward + reduce_scatter S(P'))
                reshard_after_forward false: A * (all_gather S(P') +
                  reduce_scatter S(P'))
                accumulate_grads unsharded: the reduce_scatter once per step.
  hybrid_shard  full_shard over dp_shard + all_reduce(dp_replicate) of the
                gradient shards once per step: S(P'/S_shard).
  every sharded strategy: + all_reduce(dp_shard) of the 4-byte squared norm
                (clip_grad_norm over the shards); ddp's norm is local.
Per-block strategies (a block's own `strategy`, `reshard_after_forward`):
  each block's parameters follow the forms above for its own strategy (a
  ddp block's buckets unpadded), summed per row; the norm's all_reduce is
  there when any block shards. expected_mixed() computes this per block,
  and is checked against expected() where every block has one strategy.
  Memory, exactly up to the 256-byte alignment of each buffer: optimizer
  state 8L, parameters 4(L + F), gradients 4(L + G), where L is what this
  rank updates (ddp blocks whole, the rest padded/S), F the full params
  zero1/zero2 keep (padded) and G the full gradients they keep.
Recompute (every block `recompute true`; check_recompute): each block of these
  MLPs is h = relu(linear(x, w, b)) (the head without relu); its backward
  reads the linear's output (relu_grad's x, or cross_entropy_grad's logits)
  and the block's input, which stays alive, so the copy is exactly the
  linear - except the head's: the loss's backward (cross_entropy_grad, outside
  any block) reads the logits before the head's backward starts, so they are
  never dropped. Extra FLOPs per micro-batch = sum over the blocks but the
  last of 2*M*in*out + M*out (M = micro_batch), the "of which recompute" row;
  the micro-batch row grows by exactly that; the activations at the step's
  peak do not grow (ddp: they shrink; under full_shard the peak can be where
  a gathered block dominates).
Mixed precision (check_bf16, and check_gpt2_bf16 for models/gpt2.dp, full_shard
at 8 ranks): with precision bf16 the all_gather rows are exactly half of the
f32 run's (bytes and bus bytes: they move the bf16 compute copies), the
gradient reductions unchanged with reduce_dtype f32 and halved with bf16; the
memory rows of the f32 masters and the optimizer state are the f32 run's
(zero1/zero2: the masters are 4L, the full params becoming bf16 copies), the
bf16 copies 2 bytes per element; GPT-2's activations at the step's peak
(ddp) halve up to alignment.
Offload (check_offload): with `offload optimizer` the host arena holds the
optimizer state 8L, the f32 masters 4L, the gradients' copy 4L and in bf16
the bf16 copy 2L (each buffer aligned); the device arena shrinks by exactly
the state (and in bf16 the masters) it no longer holds. Per-block offload
(check_offload_mix): the first block `offload optimizer` under full_shard:
the host rows in L_o (that block's elements per rank) alone, the device's
optimizer state 8(L - L_o).
P'_first: the first block's backward never reads its weights (the input x
needs no gradient: grad.fc1.w = x^T d.t, no d.x), so dp does not gather it
again for the backward; check_ir() verifies that in the IR.

Units, chosen so the padding has a closed form:
  full_shard/hybrid: one unit per block (blocks padded separately);
  zero1/zero2: bucket_mb 1024 (the whole model is one unit: P' = P padded
  once) and bucket_mb 1e-6 (every parameter its own unit: each padded). The
  greedy fill of intermediate bucket sizes is left to the golden IR files.
"""
import os
import re
import subprocess
import sys
import tempfile
from fractions import Fraction

DPC = os.environ.get("DPC", "build/dpc")
KNOWN = {"mlp": 247766, "mlp8": 27593}  # hand-computed: see the model files
ALIGN = 256  # the arena aligns each buffer to 256 bytes

failures = 0
checks = 0


def ok(cond, what):
    global failures, checks
    checks += 1
    if cond:
        print(f"  ok   {what}")
    else:
        failures += 1
        print(f"  FAIL {what}")
    return cond


def model_params(text):
    """[(block, [param numels in order])] from the model text."""
    blocks = []
    cur = None
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        m = re.match(r"\s*block\s+(\w+)\s*\{", line)
        if m:
            cur = (m.group(1), [])
            blocks.append(cur)
        m = re.match(r"\s*param\s+\w+\s*:\s*f32\[([0-9,\s]+)\]", line)
        if m:
            n = 1
            for d in m.group(1).split(","):
                n *= int(d)
            cur[1].append(n)
    return blocks


def setting(text, name, default):
    m = re.search(r"^\s*" + name + r"\s+(\S+)", text, re.M)
    return m.group(1) if m else default


def pad(x, n):
    return -(-x // n) * n


def dpc(src_text, args):
    with tempfile.NamedTemporaryFile("w", suffix=".dp", delete=False) as f:
        f.write(src_text)
        path = f.name
    try:
        r = subprocess.run([DPC, path] + args, capture_output=True, text=True)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        raise RuntimeError(f"dpc {' '.join(args)} failed: {r.stderr.strip()[:400]}")
    return r.stdout


ROW = re.compile(r"^(all_reduce|all_gather|reduce_scatter)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)"
                 r"\s+(\d+) \([^)]*\)\s+(\d+) \([^)]*\)\s*$")
MEM = re.compile(r"^(parameters|parameters, 16-bit copies|temporaries \(arena region\)|gradients|optimizer state|  activations"
                 r"|  gathered parameters|  unsharded gradients|  live at the step's peak"
                 r"|total \(arena size\)|host parameters|host parameters, 16-bit copies|host gradients"
                 r"|host optimizer state|host metrics|total \(host arena size\))\s+(\d+) \(")


def parse_stats(out):
    coll, mem = {}, {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            key = (m.group(1), m.group(2))
            assert key not in coll, f"two rows for {key}"
            coll[key] = tuple(int(m.group(i)) for i in range(3, 8))  # ranks calls buckets bytes bus
        m = MEM.match(line)
        if m:
            mem[m.group(1).strip()] = int(m.group(2))
    return coll, mem


def row(ranks, calls, buckets, elems, factor):
    """Expected (ranks, calls, buckets, bytes, bus) for `calls` collectives
    moving `elems` f32 elements in all; factor: 2 all_reduce, 1 otherwise."""
    size = 4 * elems
    bus = Fraction(factor * (ranks - 1), ranks) * size
    assert bus.denominator == 1, "bus bytes not an integer"
    return (ranks, calls, buckets, size, int(bus))


def expected(blocks, strategy, R, S, A, knobs):
    """The closed-form collective table for one compile (see the docstring)."""
    params = [p for _, ps in blocks for p in ps]
    P = sum(params)
    exp = {}
    if strategy == "ddp":
        # bucket_mb 1024: one bucket
        exp[("all_reduce", "dp_replicate,dp_shard")] = row(R * S, 1, 1, P, 2)
        return exp
    norm = row(S, 1, 0, 1, 2)  # the squared norm, one f32
    if strategy in ("zero1", "zero2"):
        if knobs.get("bucket") == "tiny":
            units = params  # every parameter its own unit
        else:
            units = [P]  # one unit
        U = len(units)
        Pp = sum(pad(u, S) for u in units)
        if strategy == "zero1":
            exp[("all_reduce", "dp_replicate,dp_shard")] = row(R * S, U, U, Pp, 2)
        else:
            exp[("reduce_scatter", "dp_shard")] = row(S, U, U, Pp, 1)
        exp[("all_gather", "dp_shard")] = row(S, U, U, Pp, 1)
        exp[("all_reduce", "dp_shard")] = norm
        return exp
    # full_shard / hybrid_shard: one unit per block
    units = [pad(sum(ps), S) for _, ps in blocks]
    U = len(units)
    Pp = sum(units)
    first = units[0]
    if knobs.get("reshard", True):
        ag = row(S, A * (2 * U - 1), 2 * U - 1, A * (Pp + Pp - first), 1)
    else:
        ag = row(S, A * U, U, A * Pp, 1)
    exp[("all_gather", "dp_shard")] = ag
    rs_times = 1 if knobs.get("unsharded") else A
    exp[("reduce_scatter", "dp_shard")] = row(S, rs_times * U, U, rs_times * Pp, 1)
    if strategy == "hybrid_shard":
        exp[("all_reduce", "dp_replicate")] = row(R, U, U, Pp // S, 2)
    exp[("all_reduce", "dp_shard")] = norm
    return exp


def expected_mixed(blocks, strat_of, R, S, A, knobs, reshard_of=None):
    """The collective table with a strategy per block (strat_of: block ->
    strategy), zero1/zero2/ddp buckets one per parameter (bucket_mb tiny)."""
    exp = {}

    def add(key, ranks, calls, buckets, elems, factor):
        r = row(ranks, calls, buckets, elems, factor)
        if key in exp:
            old = exp[key]
            r = (ranks,) + tuple(a + b for a, b in zip(old[1:], r[1:]))
        exp[key] = r

    dp, sh, rp = "dp_replicate,dp_shard", "dp_shard", "dp_replicate"
    sharded = False
    for i, (b, ps) in enumerate(blocks):
        s = strat_of[b]
        if s == "ddp":
            for p in ps:
                add(("all_reduce", dp), R * S, 1, 1, p, 2)
            continue
        sharded = True
        if s in ("zero1", "zero2"):
            for p in ps:
                pp = pad(p, S)
                if s == "zero1":
                    add(("all_reduce", dp), R * S, 1, 1, pp, 2)
                else:
                    add(("reduce_scatter", sh), S, 1, 1, pp, 1)
                    if R > 1:
                        add(("all_reduce", rp), R, 1, 1, pp // S, 2)
                add(("all_gather", sh), S, 1, 1, pp, 1)
            continue
        u = pad(sum(ps), S)
        reshard = (reshard_of or {}).get(b, knobs.get("reshard", True))
        add(("all_gather", sh), S, A, 1, A * u, 1)
        if reshard and i > 0:
            add(("all_gather", sh), S, A, 1, A * u, 1)
        rs_times = 1 if knobs.get("unsharded") else A
        add(("reduce_scatter", sh), S, rs_times, 1, rs_times * u, 1)
        if s == "hybrid_shard":
            add(("all_reduce", rp), R, 1, 1, u // S, 2)
    if sharded:
        add(("all_reduce", sh), S, 1, 0, 1, 2)
    return exp


def mixed_memory(blocks, strat_of, S, knobs):
    """(L, F, G) in elements: this rank's updated part, the full params and
    the full gradients kept (see the docstring)."""
    L = F = G = 0
    for b, ps in blocks:
        s = strat_of[b]
        if s == "ddp":
            L += sum(ps)
        elif s in ("zero1", "zero2"):
            for p in ps:
                L += pad(p, S) // S
                F += pad(p, S)
                G += pad(p, S)
        else:
            L += pad(sum(ps), S) // S
            if knobs.get("unsharded"):
                G += pad(sum(ps), S)
    return L, F, G


def edit_blocks(text, settings):
    """text with each block's own settings ({block: [lines]}) written first
    in its body."""
    for b, lines in settings.items():
        t = re.sub(r"^(\s*)block " + b + r" \{\n", lambda m: m.group(0) + "".join(
            m.group(1) + "  " + e + "\n" for e in lines), text, count=1, flags=re.M)
        assert t != text, f"no block {b}"
        text = t
    return text


def check_mixed(model, text, blocks):
    """Per-block strategies: the collective table and the memory rows."""
    names = [b for b, _ in blocks]
    A = int(setting(text, "grad_accum", "1"))
    tiny = "0.000001"
    # one strategy per block through the per-block form equals expected()
    for s in ("zero1", "zero2", "full_shard", "hybrid_shard"):
        knobs = {"bucket": "tiny"} if s.startswith("zero") else {}
        for S in (1, 2, 4):
            ok(expected_mixed(blocks, {b: s for b in names}, 1, S, A, {}) ==
               expected(blocks, s, 1, S, A, knobs),
               f"{model}: the per-block form of {s} at n={S} equals its own form")
    # the first block ddp, the last zero2, the second zero1, the third
    # not resharded, the rest train's full_shard
    mix = {b: "full_shard" for b in names}
    own = {names[0]: ["strategy ddp"], names[-1]: ["strategy zero2"], names[1]: ["strategy zero1"]}
    mix.update({names[0]: "ddp", names[-1]: "zero2", names[1]: "zero1"})
    reshard_of = {}
    if len(names) > 3:
        own[names[2]] = ["reshard_after_forward false"]
        reshard_of[names[2]] = False
    cases = [
        ("full_shard, mixed blocks", edit_blocks(edit(text, "full_shard", bucket=tiny), own), mix, {}),
        ("full_shard, mixed blocks, accumulate_grads unsharded",
         edit_blocks(edit(text, "full_shard", bucket=tiny, extra=["accumulate_grads unsharded"]), own),
         mix, {"unsharded": True}),
        ("ddp with one full_shard block",
         edit_blocks(edit(text, "ddp", bucket=tiny), {names[1]: ["strategy full_shard"]}),
         {b: ("full_shard" if b == names[1] else "ddp") for b in names}, {}),
    ]
    for what, t, strat_of, knobs in cases:
        for n in (1, 2, 4):
            coll, mem = parse_stats(dpc(t, ["--world-size", str(n), "--emit=stats"]))
            exp = expected_mixed(blocks, strat_of, 1, n, A, knobs, reshard_of)
            if not ok(coll == exp, f"{model} {what} n={n}: collective table = closed form"):
                for k in sorted(set(coll) | set(exp)):
                    print(f"       {k}: dpc {coll.get(k)} want {exp.get(k)}")
            L, F, G = mixed_memory(blocks, strat_of, n, knobs)
            for rname, lo, nbuf in (("optimizer state", 8 * L, 2), ("parameters", 4 * (L + F), 2),
                                    ("gradients", 4 * (L + G), 2)):
                got = mem.get(rname)
                ok(got is not None and lo <= got < lo + ALIGN * nbuf,
                   f"{model} {what} n={n}: {rname} {got} in [{lo}, {lo + ALIGN * nbuf})")
    # hybrid_shard on 2x2 with a ddp and a zero2 block (zero2 reduces its
    # shards over dp_replicate)
    strat_of = {b: "hybrid_shard" for b in names}
    strat_of.update({names[0]: "ddp", names[-1]: "zero2"})
    t = edit_blocks(edit(text, "hybrid_shard", mesh="dp_replicate=2, dp_shard=2", bucket=tiny),
                    {names[0]: ["strategy ddp"], names[-1]: ["strategy zero2"]})
    coll, _ = parse_stats(dpc(t, ["--emit=stats"]))
    exp = expected_mixed(blocks, strat_of, 2, 2, A, {})
    if not ok(coll == exp, f"{model} hybrid_shard 2x2, a ddp and a zero2 block: collective table = closed form"):
        for k in sorted(set(coll) | set(exp)):
            print(f"       {k}: dpc {coll.get(k)} want {exp.get(k)}")


def edit(text, strategy, mesh=None, extra=(), bucket=None, accum=None):
    t = re.sub(r"^(\s*)strategy \w+", r"\1strategy " + strategy, text, count=1, flags=re.M)
    if mesh:
        t = re.sub(r"^mesh .*$", "mesh " + mesh, t, count=1, flags=re.M)
    if bucket is not None:
        t = re.sub(r"^(\s*)bucket_mb \S+", r"\g<1>bucket_mb " + bucket, t, count=1, flags=re.M)
    if accum is not None:
        t = re.sub(r"^(\s*)grad_accum \S+", r"\g<1>grad_accum " + str(accum), t, count=1, flags=re.M)
    if extra:
        t = re.sub(r"^(\s*)(strategy \w+)", lambda m: m.group(1) + m.group(2) + "".join(
            "\n" + m.group(1) + e for e in extra), t, count=1, flags=re.M)
    return t


def check_table(name, text, args, strategy, R, S, A, knobs):
    coll, _ = parse_stats(dpc(text, args + ["--emit=stats"]))
    exp = expected(BLOCKS, strategy, R, S, A, knobs)
    good = ok(coll == exp, f"{name}: collective table = closed form")
    if not good:
        for k in sorted(set(coll) | set(exp)):
            print(f"       {k}: dpc {coll.get(k)} want {exp.get(k)}  (ranks calls buckets bytes bus)")


def check_ir(model, text, blocks):
    """full_shard at 4 ranks: every block but the first is all_gathered again
    for the backward, and no backward node reads the first block's weights."""
    ir = dpc(edit(text, "full_shard"), ["--world-size", "4", "--dump-after=schedule"])
    regathered = set(re.findall(r"^bucket r\d+ all_gather \S+ elems=\d+ %(\w+)\.gather\.bwd ", ir, re.M))
    names = [b for b, _ in blocks]
    ok(regathered == set(names[1:]),
       f"{model}: full_shard re-gathers for the backward exactly {names[1:]} (not {names[0]})")
    first = names[0]
    pnames = re.findall(r"^\s*param\s+(\w+)", text.split(f"block {first}", 1)[1].split("block ", 1)[0], re.M)
    weights = {f"%{first}.{p}" for p in pnames} | {f"%{first}.{p}.bwd" for p in pnames}
    reads = []
    for line in ir.splitlines():
        if not line.startswith("%") or " = " not in line:
            continue
        toks = [t.strip(",") for t in line.split(" = ", 1)[1].split()]
        # the first block's weights: its params, their ".bwd" views, its
        # gathered buffers
        if "bwd" in toks and any(t in weights or t.startswith(f"%{first}.gather") for t in toks):
            reads.append(line.split()[0])
    ok(pnames and not reads,
       f"{model}: no backward node reads {first}'s weights {sorted(weights)} (found {reads})")


def linear_shapes(text):
    """[(block, in, out)] from each block's `param w: f32[in, out]` line."""
    out, cur = [], None
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        m = re.match(r"\s*block\s+(\w+)\s*\{", line)
        if m:
            cur = m.group(1)
        m = re.match(r"\s*param\s+w\s*:\s*f32\[\s*(\d+)\s*,\s*(\d+)\s*\]", line)
        if m:
            out.append((cur, int(m.group(1)), int(m.group(2))))
    return out


FLOPS = re.compile(r"^(micro-batch \(forward \+ backward\)|  of which recompute \(forward again\))"
                   r"\s+(\d+) \(")
ACT = re.compile(r"^  activations\s+(\d+) \(")
MB = re.compile(r"micro_batch (\d+) x")


def flop_rows(out):
    rows = {m.group(1).strip(): int(m.group(2)) for m in map(FLOPS.match, out.splitlines()) if m}
    act = [int(m.group(1)) for m in map(ACT.match, out.splitlines()) if m]
    return rows, act[0] if act else None, int(MB.search(out).group(1))


def check_recompute(model, text):
    shapes = linear_shapes(text)
    ok(len(shapes) == len(BLOCKS), f"{model}: a linear weight per block ({len(shapes)})")
    rc = edit_blocks(text, {b: ["recompute true"] for b, _, _ in shapes})
    for strategy in ("ddp", "full_shard"):
        for n in (1, 2):
            args = ["--world-size", str(n), "--emit=stats"]
            base, act0, M = flop_rows(dpc(edit(text, strategy), args))
            got, act1, _ = flop_rows(dpc(edit(rc, strategy), args))
            want = sum(2 * M * i * o + M * o for _, i, o in shapes[:-1])
            again = got.get("of which recompute (forward again)")
            ok(again == want, f"{model} {strategy} n={n} recompute: extra flops {again} = "
               f"sum over the blocks but the head of 2*M*in*out + M*out = {want} (M={M})")
            mb0, mb1 = base.get("micro-batch (forward + backward)"), got.get("micro-batch (forward + backward)")
            ok(mb0 is not None and mb1 == mb0 + want,
               f"{model} {strategy} n={n} recompute: micro-batch flops {mb0} + {want} = {mb1}")
            ok("of which recompute (forward again)" not in base,
               f"{model} {strategy} n={n}: no recompute row without recompute")
            ok(act0 is not None and act1 is not None and
               (act1 < act0 if strategy == "ddp" else act1 <= act0),
               f"{model} {strategy} n={n} recompute: activations at the peak {act0} -> {act1}")


def check_memory(model, text):
    P = sum(p for _, ps in BLOCKS for p in ps)
    U_blocks = len(BLOCKS)
    for strategy in ("full_shard", "hybrid_shard", "zero1", "zero2"):
        mem = {}
        for n in (1, 2, 4):
            _, mem[n] = parse_stats(dpc(edit(text, strategy), ["--world-size", str(n), "--emit=stats"]))
        U = U_blocks if strategy in ("full_shard", "hybrid_shard") else len(
            [p for _, ps in BLOCKS for p in ps])  # buckets: at most one per parameter
        # The bound: rank shard of P elements is P/n rounded up per unit
        # (padding adds < 1 element per unit per rank: < 4U bytes), and each
        # buffer is aligned to 256 bytes (< 256 per buffer: 1 for params and
        # grads, 2 for AdamW's m and v).
        rows = [("optimizer state", 8, 2)]
        if strategy in ("full_shard", "hybrid_shard"):
            rows = [("parameters", 4, 1), ("gradients", 4, 1)] + rows
        for rname, bpe, nbuf in rows:
            for n in (1, 2, 4):
                lo = Fraction(bpe * P, n)
                hi = lo + bpe * U + ALIGN * nbuf
                got = mem[n].get(rname)
                ok(got is not None and lo <= got < hi,
                   f"{model} {strategy} n={n}: {rname} {got} in [{bpe}P/n, +{bpe}U+{ALIGN * nbuf}) = "
                   f"[{float(lo):.0f}, {float(hi):.0f})")
        if strategy in ("full_shard", "hybrid_shard"):
            tot = {n: sum(mem[n][r] for r in ("parameters", "gradients", "optimizer state")) for n in (1, 2, 4)}
            ok(tot[1] == ALIGN * (-(-4 * P // ALIGN)) * 4,
               f"{model} {strategy}: params+grads+optimizer at n=1 = 4 aligned copies of 4P ({tot[1]})")
            ok(tot[2] < tot[1] and tot[4] < tot[2],
               f"{model} {strategy}: params+grads+optimizer per rank {tot[1]} > {tot[2]} > {tot[4]}")


HELD = re.compile(r"^\s*held: params (\d+) B .*?, grads (\d+) B, optimizer state (\d+) B")


def check_pipeline(model, text):
    """pp=2 under the sharded strategies (passes/stage_params.c): each stage's
    ranks hold only its own blocks' parameters, gradients and optimizer
    state, sharded over its dp_shard group: --stats' `held:` line of stage
    k is mixed_memory() of stage k's blocks alone (the cut given by a
    block's `stage 1`, the blocks after it following), exactly up to the
    256-byte alignment of each buffer; and the largest stage's persistent
    bytes are below the same dp_shard's at pp=1."""
    names = [b for b, _ in BLOCKS]
    cut = len(names) // 2
    stage_blocks = [BLOCKS[:cut], BLOCKS[cut:]]
    for s in ("zero1", "zero2", "full_shard", "hybrid_shard"):
        for S in (1, 2):
            t = edit(text, s, mesh=f"pp=2, dp_shard={S}",
                     bucket="0.000001" if s.startswith("zero") else None)
            out = dpc(edit_blocks(t, {names[cut]: ["stage 1"]}), ["--emit=stats"])
            held = [tuple(int(x) for x in m.groups()) for m in map(HELD.match, out.splitlines()) if m]
            if not ok(len(held) == 2, f"{model} {s} pp=2 x dp_shard={S}: a held: line per stage"):
                continue
            for k in (0, 1):
                L, F, G = mixed_memory(stage_blocks[k], {b: s for b, _ in BLOCKS}, S, {})
                for (rname, lo), got in zip((("params", 4 * (L + F)), ("grads", 4 * (L + G)),
                                             ("optimizer state", 8 * L)), held[k]):
                    ok(lo <= got < lo + ALIGN * 2,
                       f"{model} {s} pp=2 x dp_shard={S} stage {k} ({stage_blocks[k][0][0]}.."
                       f"{stage_blocks[k][-1][0]}): held {rname} {got} in [{lo}, {lo + ALIGN * 2})")
            _, mem = parse_stats(dpc(edit(text, s, mesh=f"dp_shard={S}",
                                          bucket="0.000001" if s.startswith("zero") else None),
                                     ["--emit=stats"]))
            one = sum(mem[r] for r in ("parameters", "gradients", "optimizer state"))
            most = max(sum(h) for h in held)
            ok(most < one, f"{model} {s} dp_shard={S}: params+grads+optimizer per rank fall with pp: "
                           f"pp=2's largest stage {most} < pp=1's {one}")


def halve(r):
    """A row moving bf16 instead of f32: bytes and bus bytes exactly halved."""
    ranks, calls, buckets, size, bus = r
    assert size % 2 == 0 and bus % 2 == 0, f"odd bytes {r}"
    return (ranks, calls, buckets, size // 2, bus // 2)


def aligned(b):
    return ALIGN * (-(-b // ALIGN))


def check_bf16(model, text):
    """precision bf16: the all_gathers move the bf16 compute copies (exactly
    half of f32's bytes); gradients are reduced in reduce_dtype (f32 by
    default: those rows unchanged; bf16: halved too; the norm's 4-byte
    all_reduce is f32 always). Memory: the f32 masters ("parameters"),
    gradients (reduce f32) and optimizer state are EXACTLY the f32 run's; the
    compute copies are 2 bytes per element of what f32 keeps of the params
    beside the update's part: ddp 2P, zero1/zero2 2(L + F), full_shard 2L
    (each aligned to 256 bytes once per buffer). zero1/zero2 keep only this
    rank's masters (4L: f32 kept 4(L + F), its full params being f32): their
    full params are bf16 copies."""
    for strategy, knobs, bucket in (("ddp", {}, "1024"), ("zero1", {}, "1024"),
                                    ("zero2", {"bucket": "tiny"}, "0.000001"),
                                    ("full_shard", {}, None), ("hybrid_shard", {}, None)):
        for reduce in ("f32", "bf16"):
            extra = ["precision bf16"] + (["reduce_dtype bf16"] if reduce == "bf16" else [])
            for n in (1, 2, 4):
                A = int(setting(text, "grad_accum", "1"))
                t32 = edit(text, strategy, bucket=bucket)
                t16 = edit(text, strategy, bucket=bucket, extra=extra)
                args = ["--world-size", str(n), "--emit=stats"]
                c32, m32 = parse_stats(dpc(t32, args))
                c16, m16 = parse_stats(dpc(t16, args))
                exp = expected(BLOCKS, strategy, 1, n, A, knobs)
                ok(c32 == exp, f"{model} {strategy} n={n}: f32 table = closed form")
                want = {}
                for k, r in exp.items():
                    grads = k[0] != "all_gather" and r[3] != 4  # not the norm
                    want[k] = halve(r) if k[0] == "all_gather" or (grads and reduce == "bf16") else r
                what = f"{model} {strategy} n={n} bf16 (reduce {reduce})"
                if not ok(c16 == want, f"{what}: all_gather bytes = f32/2, gradient "
                          f"reductions in {reduce}"):
                    for k in sorted(set(c16) | set(want)):
                        print(f"       {k}: dpc {c16.get(k)} want {want.get(k)}")
                zero = strategy in ("zero1", "zero2")
                for rname in ("optimizer state",) + (("parameters",) if not zero else ()) + \
                        (("gradients",) if reduce == "f32" else ()):
                    ok(m16.get(rname) == m32.get(rname),
                       f"{what}: {rname} {m16.get(rname)} = f32's {m32.get(rname)}")
                if reduce == "bf16":
                    g = m16.get("gradients")
                    ok(g is not None and aligned(m32["gradients"] // 2) - ALIGN <= g <= aligned(m32["gradients"] // 2) + ALIGN,
                       f"{what}: gradients {g} = f32's / 2 ({m32['gradients'] // 2}) up to alignment")
                P = sum(p for _, ps in BLOCKS for p in ps)
                if strategy == "ddp":
                    copies = 2 * P
                elif strategy in ("zero1", "zero2"):
                    units = [P] if bucket == "1024" else [p for _, ps in BLOCKS for p in ps]
                    L = sum(pad(u, n) // n for u in units)
                    F = sum(pad(u, n) for u in units)
                    copies = 2 * (L + F)
                    # the masters are this rank's part only: f32 kept 4(L + F)
                    ok(m16.get("parameters") == aligned(4 * L) and m32["parameters"] >= 4 * (L + F),
                       f"{what}: f32 masters {m16.get('parameters')} = 4L aligned ({aligned(4 * L)}); "
                       f"f32 kept 4(L + F) = {4 * (L + F)} ({m32['parameters']})")
                else:
                    copies = 2 * sum(pad(sum(ps), n) // n for _, ps in BLOCKS)
                got = m16.get("parameters, 16-bit copies")
                nbuf = 2 if strategy in ("zero1", "zero2") else 1
                ok(got is not None and copies <= got < copies + ALIGN * nbuf,
                   f"{what}: bf16 copies {got} in [{copies}, +{ALIGN * nbuf})")


def check_offload(model, text):
    """offload optimizer (passes/offload.c), ddp / zero2 (one bucket) /
    full_shard at n = 1, 2, 4, f32 and bf16, against the same model without
    it. L = the elements this rank updates (ddp P; zero2 P'/n; full_shard
    the sum of each block's P'/n). The host arena holds, each buffer aligned
    to 256 bytes: the optimizer state (AdamW's m and v, 8L: EXACTLY the
    device's row without offload, and 0 on the device), the f32 masters
    (4L: in bf16 moved from the device, whose row becomes 0; in f32 a host
    copy, the device's row unchanged), the reduced gradients' copy (4L),
    the gradient norm's copy the clip on the host reads (one aligned f32:
    the models clip) and, in bf16, the copy of the bf16 parameters the
    update writes (2L). Under full_shard (grad_accum 2: each block's shard
    sums its reduce_scatters) the gradient shards themselves live on the
    host: the device's gradients row moves whole (4L), and the host adds a
    staging buffer per block for its reduce_scatter's result (4 P'/n each,
    aligned) and the sqnorm's copy (one aligned f32). Under zero2 (its
    shard reduced once, in the last micro-batch) the shard lives on the
    host too: the device's gradients row loses it (4L), the unsharded
    buffer stays, the host gradients row adds the sqnorm's copy, and the
    temporaries may grow by the reduce_scatter's device result (4L), which
    lives until its D2H is waited for. Otherwise (ddp) the device
    keeps its gradients; it keeps its bf16 copies; its arena shrinks by
    exactly what moved, but for the temporaries, which in bf16 may grow by
    the device copy of one bucket's host master shard that the EXPORT
    program's all_gather reads (passes/offload.c: NCCL cannot read the host
    arena); in f32 they are planned alike. The host arena is the sum of its
    rows. offload params against it: check_offload_params."""
    P = sum(p for _, ps in BLOCKS for p in ps)
    for strategy, bucket in (("ddp", "1024"), ("zero2", "1024"), ("full_shard", None)):
        for prec in ("f32", "bf16"):
            extra = ["precision bf16"] if prec == "bf16" else []
            for n in (1, 2, 4):
                args = ["--world-size", str(n), "--emit=stats"]
                _, m0 = parse_stats(dpc(edit(text, strategy, bucket=bucket, extra=extra), args))
                _, m1 = parse_stats(dpc(edit(text, strategy, bucket=bucket,
                                             extra=extra + ["offload optimizer"]), args))
                if strategy == "ddp":
                    L = P
                elif strategy == "zero2":
                    L = pad(P, n) // n
                else:
                    L = sum(pad(sum(ps), n) // n for _, ps in BLOCKS)
                what = f"{model} {strategy} n={n} {prec} offload optimizer"
                want = {"host optimizer state": 2 * aligned(4 * L), "host parameters": aligned(4 * L),
                        "host gradients": aligned(4 * L), "host metrics": aligned(4)}
                if prec == "bf16":
                    want["host parameters, 16-bit copies"] = aligned(2 * L)
                host_grads = strategy == "full_shard"
                shard_host = strategy == "zero2"  # its reduce_scatter's shard, D2H'd from a temporary
                if host_grads:
                    want["host gradients"] += sum(aligned(4 * (pad(sum(ps), n) // n))
                                                  for _, ps in BLOCKS) + aligned(4)
                if shard_host:
                    want["host gradients"] += aligned(4)
                got = {k: m1.get(k) for k in want}
                if not ok(got == want, f"{what}: host rows = closed form in L={L} {want}"):
                    print(f"       dpc {got}")
                ok(m1.get("host optimizer state") == m0.get("optimizer state") and
                   m1.get("optimizer state") == 0,
                   f"{what}: the optimizer state moved whole ({m0.get('optimizer state')} B)")
                moved = (m0["optimizer state"] + (m0["parameters"] if prec == "bf16" else 0) +
                         (m0["gradients"] if host_grads else 0) + (aligned(4 * L) if shard_host else 0))
                keep = (["parameters, 16-bit copies"] + ([] if host_grads or shard_host else ["gradients"]) +
                        (["parameters"] if prec == "f32" else []))
                ok(not host_grads or (m1.get("gradients") == 0 and m0["gradients"] == aligned(4 * L)),
                   f"{what}: the gradient shards moved whole ({m0['gradients']} B)")
                ok(not shard_host or m1.get("gradients") == m0["gradients"] - aligned(4 * L),
                   f"{what}: the gradient shard moved ({m0['gradients']} -> {m1.get('gradients')} B: "
                   f"the unsharded buffer stays, -4L = {aligned(4 * L)})")
                # in bf16 the masters' all_gather (EXPORT) reads its host
                # shard through a device temporary (NCCL cannot read the
                # host arena): the temporaries may grow by one bucket's
                # shard (ddp/zero2: one bucket, 4L; full_shard: a block's);
                # the plan places them anew, so they may also shrink
                T = "temporaries (arena region)"
                dev = 0 if prec == "f32" else (aligned(4 * L) if strategy != "full_shard" else
                                              max(aligned(4 * (pad(sum(ps), n) // n)) for _, ps in BLOCKS))
                # zero2: the shard's reduce_scatter writes a device temporary
                # (4L over one bucket) that lives until its D2H is waited for
                if shard_host:
                    dev += aligned(4 * L)
                ok(all(m1.get(k) == m0.get(k) for k in keep) and
                   (prec == "f32" or m1.get("parameters") == 0) and
                   m1["total (arena size)"] - m1[T] == m0["total (arena size)"] - m0[T] - moved and
                   m1[T] <= m0[T] + dev,
                   f"{what}: device arena {m1['total (arena size)']} = "
                   f"{m0['total (arena size)']} - {moved} moved + temporaries {m0[T]} -> {m1[T]} "
                   f"(at most +{dev}); {', '.join(keep)} kept")
                ok(m1.get("total (host arena size)") == sum(want.values()),
                   f"{what}: host arena {m1.get('total (host arena size)')} = its rows")
                ok(m0.get("total (host arena size)") is None,
                   f"{model} {strategy} n={n} {prec}: no host arena without offload")
                check_offload_params(m1, parse_stats(dpc(edit(text, strategy, bucket=bucket,
                                                              extra=extra + ["offload params"]), args))[1],
                                     f"{model} {strategy} n={n} {prec} offload params", L, prec)


def check_offload_mix(model, text):
    """Per-block offload (passes/offload.c's split_mixed and window_mixed):
    the first block `offload optimizer`, the others train's none, full_shard
    at n = 1, 2, 4, f32 and bf16, against the same model without offload.
    L_o = the first block's elements per rank (its P'/n), L = every
    block's. The host arena holds, each buffer aligned: the first block's
    optimizer state (8L_o: m and v), its f32 masters (4L_o: bf16 moved
    from the device, f32 their host copy), the host copy of its gradient
    run (4L_o: a window of the device's gradients, which stay there; the
    run's D2Hs fill it during the backward), in bf16 that of its 16-bit
    copy (2L_o), and the gradient norm's host copy (4 bytes, aligned: the
    run is clipped on the host, by a copy of the step's clip); nothing
    else. The device keeps the others' state (8(L - L_o)), its masters
    but the first block's in bf16, its gradients and 16-bit copies
    unchanged, and its persistent part shrinks by exactly what moved."""
    first, ps0 = BLOCKS[0]
    for prec in ("f32", "bf16"):
        extra = ["precision bf16"] if prec == "bf16" else []
        for n in (1, 2, 4):
            args = ["--world-size", str(n), "--emit=stats"]
            base = edit(text, "full_shard", extra=extra)
            _, m0 = parse_stats(dpc(base, args))
            _, m1 = parse_stats(dpc(edit_blocks(base, {first: ["offload optimizer"]}), args))
            Lo = pad(sum(ps0), n) // n
            L = sum(pad(sum(ps), n) // n for _, ps in BLOCKS)
            what = f"{model} full_shard n={n} {prec}, {first} offload optimizer"
            want = {"host optimizer state": 2 * aligned(4 * Lo), "host parameters": aligned(4 * Lo),
                    "host gradients": aligned(4 * Lo), "host metrics": aligned(4),
                    "host parameters, 16-bit copies": aligned(2 * Lo) if prec == "bf16" else None}
            got = {k: m1.get(k) for k in want}
            if not ok(got == want, f"{what}: host rows = closed form in L_o={Lo} {want}"):
                print(f"       dpc {got}")
            ok(m1.get("total (host arena size)") == sum(v for v in want.values() if v),
               f"{what}: host arena {m1.get('total (host arena size)')} = its rows")
            params = aligned(4 * (L - Lo)) + (aligned(4 * Lo) if prec == "f32" else 0)
            dev = {"optimizer state": 2 * aligned(4 * (L - Lo)), "parameters": params,
                   "gradients": m0["gradients"],
                   "parameters, 16-bit copies": m0.get("parameters, 16-bit copies")}
            got = {k: m1.get(k) for k in dev}
            if not ok(got == dev, f"{what}: device rows = closed form in L={L} {dev}"):
                print(f"       dpc {got}")
            T = "temporaries (arena region)"
            moved = (m0["optimizer state"] - m1["optimizer state"] +
                     m0["parameters"] - m1["parameters"])
            ok(m1["total (arena size)"] - m1[T] == m0["total (arena size)"] - m0[T] - moved,
               f"{what}: device persistent part {m0['total (arena size)'] - m0[T]} - {moved} moved")


def check_offload_params(m1, m2, what, L, prec):
    """offload params against offload optimizer (m1): the host arena is the
    same row for row (the masters were there, or their host copy, and the
    16-bit copy the update writes in bf16); the device arena's persistent
    part loses exactly the parameters the update writes: in f32 the masters
    (4L: ddp's whole parameters, zero2's and full_shard's shard; zero2's
    gathered copy stays, the all_gather's output), in bf16 the 16-bit copy
    (2L, likewise). The temporaries gain the transient copies the H2Ds fill
    before each gather or read, which never hold more than what moved."""
    host = {k: v for k, v in m1.items() if k.startswith("host ") or k.startswith("total (host")}
    got = {k: m2.get(k) for k in host}
    if not ok(got == host, f"{what}: host arena rows = offload optimizer's {host}"):
        print(f"       dpc {got}")
    row = "parameters" if prec == "f32" else "parameters, 16-bit copies"
    moved = aligned(4 * L) if prec == "f32" else aligned(2 * L)
    T = "temporaries (arena region)"
    ok(m2.get(row, 0) == m1.get(row, 0) - moved and
       m2["total (arena size)"] - m2[T] == m1["total (arena size)"] - m1[T] - moved and
       m2[T] <= m1[T] + moved,
       f"{what}: device {row} {m1.get(row, 0)} -> {m2.get(row, 0)} (-{moved} = the update's), "
       f"persistent part likewise, temporaries {m1[T]} -> {m2[T]} (at most +{moved})")


def check_gpt2_bf16(path):
    """models/gpt2.dp full_shard at 8 ranks (the issue's case): all_gather
    bytes exactly 1/2 of f32's, the reduce_scatter unchanged (reduce f32),
    masters, gradients and optimizer state unchanged, the copies 2 bytes per
    element of the shard; and under ddp (where every temporary is an
    activation) the activations at the step's peak halve: GPT-2 in bf16 has
    no cast and every temporary but the f32 loss is bf16, so
    |2 * bf16 - f32| <= 256 bytes (the arena's alignment) per temporary."""
    text = open(path).read().replace("global_batch 8", "global_batch 16")
    args = ["--world-size", "8", "--emit=stats"]
    # the sizes come from the IR here (the model's shapes are config
    # expressions): P from the flat buffer, each block's unit from its gather
    ir32 = dpc(edit(text, "ddp"), ["--world-size", "8", "--emit=ir"])
    P = int(re.search(r"^%flat\.params\s+: f32\[(\d+)\]", ir32, re.M).group(1))
    ok(P == 124439808, f"gpt2: {P} parameters (GPT-2 small, tied head: 124439808)")
    irfs = dpc(edit(text, "full_shard", extra=["precision bf16"]), ["--world-size", "8", "--emit=ir"])
    units = [int(e) for e in re.findall(r"^bucket r\d+ all_gather axes=dp_shard elems=(\d+) %[\w.]+\.gather = ",
                                         irfs, re.M)]
    ok(sum(units) >= P and sum(units) - P < 8 * len(units) and all(u % 8 == 0 for u in units),
       f"gpt2 full_shard n=8: {len(units)} units of {sum(units)} elements = P padded per block")
    L = sum(u // 8 for u in units)
    fs32 = edit(text, "full_shard")
    fs16 = edit(text, "full_shard", extra=["precision bf16"])
    c32, m32 = parse_stats(dpc(fs32, args))
    c16, m16 = parse_stats(dpc(fs16, args))
    ag32, ag16 = c32[("all_gather", "dp_shard")], c16[("all_gather", "dp_shard")]
    ok(ag16[3] * 2 == ag32[3] and ag16[4] * 2 == ag32[4] and ag16[:3] == ag32[:3],
       f"gpt2 full_shard n=8: bf16 all_gather {ag16[3]} bytes = f32's {ag32[3]} / 2 exactly")
    ok(c16[("reduce_scatter", "dp_shard")] == c32[("reduce_scatter", "dp_shard")],
       "gpt2 full_shard n=8: reduce_scatter (reduce_dtype f32) unchanged")
    for rname in ("parameters", "gradients", "optimizer state"):
        ok(m16.get(rname) == m32.get(rname), f"gpt2 full_shard n=8 bf16: {rname} {m16.get(rname)} = f32's")
    ok(m32["parameters"] == aligned(4 * L), f"gpt2 full_shard n=8: masters {m32['parameters']} = 4L aligned")
    ok(m16.get("parameters, 16-bit copies") == aligned(2 * L),
       f"gpt2 full_shard n=8 bf16: copies {m16.get('parameters, 16-bit copies')} = 2L aligned ({aligned(2 * L)})")
    peak = "live at the step's peak"
    ok(m16[peak] < m32[peak], f"gpt2 full_shard n=8: the live peak shrinks {m32[peak]} -> {m16[peak]}")
    d32 = dpc(edit(text, "ddp"), args)
    d16 = dpc(edit(text, "ddp", extra=["precision bf16"]), args)
    a32, a16 = parse_stats(d32)[1]["activations"], parse_stats(d16)[1]["activations"]
    ir = dpc(edit(text, "ddp", extra=["precision bf16"]), ["--world-size", "8", "--emit=ir"])
    temps = len(re.findall(r"^%\S+ : \S+ .*= ", ir, re.M))
    casts = len([ln for ln in ir.splitlines() if "= cast " in ln and " setup" not in ln])
    ok(casts == 0, f"gpt2 bf16: no cast in the step ({casts})")
    ok(abs(2 * a16 - a32) <= ALIGN * temps,
       f"gpt2 ddp n=8: bf16 activations at the peak {a16} = f32's {a32} / 2 within 256 B x {temps} temporaries")


def main():
    global BLOCKS
    for path in sys.argv[1:]:
        model = os.path.basename(path)[:-3]
        if model == "gpt2":
            check_gpt2_bf16(path)
            continue
        text = open(path).read()
        BLOCKS = model_params(text)
        P = sum(p for _, ps in BLOCKS for p in ps)
        ok(KNOWN.get(model) in (None, P), f"{model}: {P} parameters in {len(BLOCKS)} blocks from the text")
        A = int(setting(text, "grad_accum", "1"))
        if A < 2:
            ok(False, f"{model}: grad_accum {A}: the forms need grad_accum > 1 to see A")
        pads = [b for b, ps in BLOCKS if sum(ps) % 4]
        print(f"     {model}: blocks {[(b, sum(ps)) for b, ps in BLOCKS]}, padded at n=4: {pads}")
        check_ir(model, text, BLOCKS)
        for n in (1, 2, 4):
            ws = ["--world-size", str(n)]
            big = "1024"
            check_table(f"{model} ddp n={n}", edit(text, "ddp", bucket=big), ws, "ddp", 1, n, A, {})
            for s in ("zero1", "zero2"):
                check_table(f"{model} {s} n={n} one bucket", edit(text, s, bucket=big), ws, s, 1, n, A, {})
                check_table(f"{model} {s} n={n} a bucket per parameter", edit(text, s, bucket="0.000001"),
                            ws, s, 1, n, A, {"bucket": "tiny"})
            for s in ("full_shard", "hybrid_shard"):
                check_table(f"{model} {s} n={n}", edit(text, s), ws, s, 1, n, A, {})
                check_table(f"{model} {s} n={n} reshard_after_forward false",
                            edit(text, s, extra=["reshard_after_forward false"]), ws, s, 1, n, A,
                            {"reshard": False})
                check_table(f"{model} {s} n={n} accumulate_grads unsharded",
                            edit(text, s, extra=["accumulate_grads unsharded"]), ws, s, 1, n, A,
                            {"unsharded": True})
            check_table(f"{model} full_shard n={n} no reshard, unsharded accumulation",
                        edit(text, "full_shard", extra=["reshard_after_forward false",
                                                       "accumulate_grads unsharded"]),
                        ws, "full_shard", 1, n, A, {"reshard": False, "unsharded": True})
            check_table(f"{model} full_shard n={n} grad_accum 4", edit(text, "full_shard", accum=4),
                        ws, "full_shard", 1, n, 4, {})
            # prefetch and the gather limit move collectives, not bytes
            check_table(f"{model} full_shard n={n} prefetch 2, gather_limit_mb 0.001",
                        edit(text, "full_shard", extra=["prefetch 2", "gather_limit_mb 0.001"]),
                        ws, "full_shard", 1, n, A, {})
        check_table(f"{model} hybrid_shard 2x2", edit(text, "hybrid_shard", mesh="dp_replicate=2, dp_shard=2"),
                    [], "hybrid_shard", 2, 2, A, {})
        check_table(f"{model} hybrid_shard 2x2 accumulate_grads unsharded",
                    edit(text, "hybrid_shard", mesh="dp_replicate=2, dp_shard=2",
                         extra=["accumulate_grads unsharded"]),
                    [], "hybrid_shard", 2, 2, A, {"unsharded": True})
        check_memory(model, text)
        check_mixed(model, text, BLOCKS)
        check_recompute(model, text)
        check_bf16(model, text)
        check_offload(model, text)
        check_offload_mix(model, text)
        check_pipeline(model, text)
    print(f"stats_forms: {checks - failures} passed, {failures} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
