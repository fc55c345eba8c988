#!/usr/bin/env python3
"""tests/pipeline_forms.py - dpc --stats' pipeline section against closed forms.

  DPC=build/dpc pipeline_forms.py        (run by tests/pipeline.sh)

models/gpt2-tiny.dp (-D layers=4) at pp=2 and pp=4, and models/mlp8.dp at
pp=3, under 1f1b and gpipe, with grad_accum m = 1, 2, 4, 8 micro-batches.
Prints one "  ok ..." or "  FAIL ..." line per check; exits 1 on any FAIL.

Independence: parameter sizes come from the model's dimensions written here
(gpt2-tiny's config: vocab 256, ctx 64, d 64, ffn 4d), never from dpc. The
closed forms:
  cut (stages auto)    gpt2-tiny, 4 layers, pp=2: embed..h.1 | h.2..head (the
                       blocks' forward FLOPs are symmetric about the cut)
  params per stage     the blocks' own params, and the tied token embedding
                       wte (embed's, read by the head) on the last stage too;
                       what each stage's ranks hold (passes/stage_params.c):
                       those, their gradients and AdamW's two moments (2x),
                       and at pp=4 the tied wte on the middle stages too
  sent per micro-batch micro_batch x ctx x d x 4 bytes over every cut (only
                       the residual stream x crosses; ids and targets are
                       data, read by the stages that use them); 0 after the
                       last stage
  activations          at the peak: per micro-batch x min(p - s, m) in 1f1b
                       and zero_bubble (stage s), x m in gpipe
  bubble               (p - 1) / (m + p - 1) for both; the one simulated from
                       the stages' FLOPs is never below it (unequal stages
                       only add idle time); zero_bubble (ZB-H1, Qi et al.
                       2023): (p - 1) / (3m + p - 1) (F = B = W), and its
                       simulated bubble below 1f1b's
  work                 the stages' forward + backward FLOPs sum to the
                       micro-batch FLOPs of the compute table
  compiled peak        the step program's temporaries at their peak on each
                       stage (passes/unroll.c, memplan's lifetimes) hold at
                       least the closed form above, and under 1f1b less than
                       under gpipe when m > p (but on the last stage)
  --emit=schedule      one row per stage whose slots are the schedule's order
                       (order() below, by hand; zero_bubble's by its rules,
                       zb_rules()), its bubble --stats' simulated one
  interleaved          gpt2-tiny (6 layers) at pp=2, 4 with stages_per_rank
                       v = 2, 3: --emit=schedule's rows Megatron's order
                       (order_il(), by hand); bubble (p-1)/(vm+p-1), the
                       simulated one at least that and below 1f1b's; each
                       rank's activations at the peak min(2(p-r-1) + (v-1)p
                       + 1, mv) virtual-stage micro-batches (mv at m = p)
"""
import os
import re
import subprocess
import sys

DPC = os.environ.get("DPC", "build/dpc")
fails = 0
oks = 0


def check(cond, what):
    global fails, oks
    if cond:
        oks += 1
        print("  ok   " + what)
    else:
        fails += 1
        print("  FAIL " + what)


def stats(model, world, pp, m, sched, extra=()):
    cmd = [DPC, model, "--world-size", str(world), "--pp", str(pp), "--emit=stats",
           "--set", "train.grad_accum=%d" % m, "--set", "train.pipeline=" + sched] + list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("dpc failed: %s\n%s" % (" ".join(cmd), r.stderr))
    return r.stdout


STAGE = re.compile(r"^stage (\d+): blocks (\S+)\.\.(\S+), (\d+) FLOP forward \+ (\d+) FLOP "
                   r"backward per micro-batch, params (\d+) B \(.*?\), grads (\d+) B, "
                   r"activations (\d+) B per micro-batch x (\d+) in flight = (\d+) B .*? at "
                   r"the peak, sends (\d+) B")
BUBBLE = re.compile(r"^bubble: \(p-1\)/\(3?m\+p-1\) = ([0-9.]+); from the stages' FLOPs "
                    r"([-0-9.]+)")
HELD = re.compile(r"^  held: params (\d+) B \(.*?\), grads (\d+) B, optimizer state (\d+) B")
COMPILED = re.compile(r"^compiled: every micro-batch in the step program.*temporaries at the peak:")
PEAK = re.compile(r"stage (\d+) (\d+) B")
MICRO = re.compile(r"^micro-batch \(forward \+ backward\)\s+(\d+)")
CONFIG = re.compile(r"micro_batch (\d+) x grad_accum (\d+)")


def parse(text):
    stages = []
    bubble = micro = mb = None
    for line in text.splitlines():
        if COMPILED.match(line):
            for k, b in PEAK.findall(line.split("at the peak:", 1)[1]):
                if int(k) < len(stages):
                    stages[int(k)]["compiled"] = int(b)
        s = STAGE.match(line)
        if s:
            g = s.groups()
            stages.append(dict(first=g[1], last=g[2], fwd=int(g[3]), bwd=int(g[4]),
                               params=int(g[5]), grads=int(g[6]), act=int(g[7]),
                               fly=int(g[8]), peak=int(g[9]), send=int(g[10])))
        h = HELD.match(line)
        if h and stages:
            stages[-1].update(held=int(h.group(1)), held_grads=int(h.group(2)),
                              held_opt=int(h.group(3)))
        b = BUBBLE.match(line)
        if b:
            bubble = (float(b.group(1)), float(b.group(2)))
        u = MICRO.match(line)
        if u:
            micro = int(u.group(1))
        c = CONFIG.search(line)
        if c and mb is None:
            mb = int(c.group(1))
    return stages, bubble, micro, mb


# gpt2-tiny's dimensions (models/gpt2-tiny.dp's config)
V, CTX, D = 256, 64, 64
FFN = 4 * D
H = (2 * D + D * 3 * D + 3 * D + D * D + D + 2 * D + D * FFN + FFN + FFN * D + D) * 4
EMBED = (V * D + CTX * D) * 4
WTE = V * D * 4
LNF = 2 * D * 4


COMPILED_PEAKS = {}
BUBBLES = {}


def forms(name, text, p, m, sched):
    stages, bubble, micro, mb = parse(text)
    tag = "%s pp=%d m=%d %s" % (name, p, m, sched)
    check(len(stages) == p, "%s: %d stages printed" % (tag, len(stages)))
    if len(stages) != p or bubble is None:
        return stages, mb
    for s, st in enumerate(stages):
        fly = m if sched == "gpipe" else min(p - s, m)  # 1F1B, and ZB-H1 its peak
        check(st["fly"] == fly and st["peak"] == st["act"] * fly,
              "%s stage %d: activations %d x %d in flight = %d (closed form %d x %d)"
              % (tag, s, st["act"], st["fly"], st["peak"], st["act"], fly))
        check(st["grads"] == st["params"], "%s stage %d: grads = params (f32)" % (tag, s))
    check(stages[-1]["send"] == 0, "%s: the last stage sends nothing" % tag)
    # the compiled program (passes/unroll.c) keeps each micro-batch in flight apart
    for s, st in enumerate(stages):
        check(st.get("compiled", -1) >= st["peak"],
              "%s stage %d: compiled temporaries at the peak %d >= %d kept for the backward"
              % (tag, s, st.get("compiled", -1), st["peak"]))
    COMPILED_PEAKS[(name, p, m, sched)] = [st.get("compiled", -1) for st in stages]
    zb = sched == "zero_bubble"
    closed = (p - 1) / ((3 if zb else 1) * m + p - 1)
    check(abs(bubble[0] - closed) < 1e-4, "%s: bubble %.4f = (p-1)/(%sm+p-1) = %.4f"
          % (tag, bubble[0], "3" if zb else "", closed))
    if not zb:  # ZB-H1's form takes F = B = W, which the stages' FLOPs are not
        check(bubble[1] >= closed - 1e-4, "%s: simulated bubble %.4f >= closed form %.4f"
              % (tag, bubble[1], closed))
    BUBBLES[(name, p, m, sched)] = bubble[1]
    work = sum(st["fwd"] + st["bwd"] for st in stages)
    check(micro is not None and abs(work - micro) <= 1e-9 * micro,
          "%s: stages' FLOPs %d = micro-batch FLOPs %s" % (tag, work, micro))
    return stages, mb


for sched in ("1f1b", "gpipe"):
    for m in (1, 2, 4, 8):
        text = stats("models/gpt2-tiny.dp", 2, 2, m, sched, ["-D", "layers=4"])
        stages, mb = forms("gpt2-tiny L=4", text, 2, m, sched)
        if len(stages) != 2:
            continue
        check((stages[0]["first"], stages[0]["last"], stages[1]["first"], stages[1]["last"])
              == ("embed", "h.1", "h.2", "head"),
              "gpt2-tiny L=4 pp=2 m=%d %s: cut embed..h.1 | h.2..head (got %s..%s | %s..%s)"
              % (m, sched, stages[0]["first"], stages[0]["last"], stages[1]["first"],
                 stages[1]["last"]))
        want0, want1 = EMBED + 2 * H, 2 * H + LNF + WTE
        check(stages[0]["params"] == want0 and stages[1]["params"] == want1,
              "gpt2-tiny L=4 pp=2 m=%d %s: params %d | %d = embed + 2 h | 2 h + lnf + tied wte "
              "(%d | %d)" % (m, sched, stages[0]["params"], stages[1]["params"], want0, want1))
        # passes/stage_params.c: each stage's ranks hold only its parameters
        # (with the tied wte on both), their gradients and AdamW's two moments
        held = [(st.get("held"), st.get("held_grads"), st.get("held_opt")) for st in stages]
        check(held == [(want0, want0, 2 * want0), (want1, want1, 2 * want1)],
              "gpt2-tiny L=4 pp=2 m=%d %s: held params, grads, optimizer state %s = %s"
              % (m, sched, held, [(w, w, 2 * w) for w in (want0, want1)]))
        check(stages[0]["send"] == mb * CTX * D * 4,
              "gpt2-tiny L=4 pp=2 m=%d %s: the cut sends x: %d B = %d x %d x %d x 4"
              % (m, sched, stages[0]["send"], mb, CTX, D))
    text = stats("models/gpt2-tiny.dp", 4, 4, 8, sched, ["-D", "layers=4"])
    stages, mb = forms("gpt2-tiny L=4", text, 4, 8, sched)
    if len(stages) == 4:  # the tied wte only on stages 0 and 3, which read it
        want = [EMBED + H, H, H, H + LNF + WTE]
        check([st.get("held") for st in stages] == want and
              [st["params"] for st in stages] == [EMBED + H, H, H, H + LNF + WTE],
              "gpt2-tiny L=4 pp=4 %s: held params %s = embed + h | h | h | h + lnf "
              "+ wte %s" % (sched, [st.get("held") for st in stages], want))
    for s in range(3):
        if len(stages) == 4:
            check(stages[s]["send"] == mb * CTX * D * 4,
                  "gpt2-tiny L=4 pp=4 %s: stage %d sends x only (%d B)" % (sched, s,
                                                                           stages[s]["send"]))
    text = stats("models/mlp8.dp", 3, 3, 4, sched)
    forms("mlp8", text, 3, 4, sched)

# zero_bubble's Ws fill 1F1B's bubble: its simulated bubble is below 1F1B's
for sched in ("zero_bubble",):
    for m in (4, 8):
        forms("gpt2-tiny L=4", stats("models/gpt2-tiny.dp", 2, 2, m, sched, ["-D", "layers=4"]),
              2, m, sched)
    forms("gpt2-tiny L=4", stats("models/gpt2-tiny.dp", 4, 4, 8, sched, ["-D", "layers=4"]),
          4, 8, sched)
for key in [k for k in BUBBLES if k[3] == "zero_bubble"]:
    one = BUBBLES.get(key[:3] + ("1f1b",))
    check(one is not None and BUBBLES[key] < one,
          "%s pp=%d m=%d: simulated bubble zero_bubble %.4f < 1f1b %s"
          % (key[0], key[1], key[2], BUBBLES[key], one))

# 1F1B holds at most p - s micro-batches, gpipe all m: with m > p the compiled
# 1f1b program needs less on every stage that keeps activations
for key in [k for k in COMPILED_PEAKS if k[3] == "1f1b" and k[2] > k[1]]:
    f, g = COMPILED_PEAKS[key], COMPILED_PEAKS.get(key[:3] + ("gpipe",), [])
    for s in range(min(len(f), len(g)) - 1):  # the last stage: one in flight either way
        check(0 < f[s] < g[s], "%s pp=%d m=%d stage %d: compiled peak 1f1b %d < gpipe %d"
              % (key[0], key[1], key[2], s, f[s], g[s]))


def order(p, m, s, sched):
    """The slots of stage s, by hand: gpipe all F then all B; 1F1B (PipeDream-
    flush) p - s - 1 warm-up forwards, then F and B alternating, then the rest
    of the backwards."""
    if sched == "gpipe":
        return ["F%d" % i for i in range(m)] + ["B%d" % i for i in range(m)]
    warm = min(p - s - 1, m)
    out = ["F%d" % i for i in range(warm)]
    f, b = warm, 0
    while f < m:
        out += ["F%d" % f, "B%d" % b]
        f, b = f + 1, b + 1
    return out + ["B%d" % i for i in range(b, m)]


def zb_rules(p, m, s, got):
    """zero_bubble's slots are picked as the simulation goes (passes/stages.c,
    simulate_zb), so the row is checked by its rules: F, B and W each in
    micro-batch order, W k after B k, and at most min(p - s, m) micro-batches
    with their F run and their W not (1F1B's peak)."""
    seen = {"F": [], "B": [], "W": []}
    for slot in got:
        seen[slot[0]].append(int(slot[1:]))
        if slot[0] == "W" and int(slot[1:]) not in seen["B"]:
            return False
        if len(seen["F"]) - len(seen["W"]) > min(p - s, m):
            return False
    return all(seen[k] == list(range(m)) for k in "FBW")


# --emit=schedule: one row per stage, its slots in the schedule's order, the
# bubble the one --stats simulates
def schedule_rows(p, m, sched, extra, tag):
    """dpc --emit=schedule of gpt2-tiny: the picture and its rows (one per
    stage, or per rank under interleaved), their count checked."""
    cmd = [DPC, "models/gpt2-tiny.dp", "--world-size", str(p), "--pp", str(p),
           "--set", "train.grad_accum=%d" % m, "--set", "train.pipeline=" + sched] + extra
    pic = subprocess.run(cmd + ["--emit=schedule"], capture_output=True, text=True).stdout
    head = "rank " if sched == "interleaved" else "stage "
    rows = [l for l in pic.splitlines() if l.startswith(head)]
    check(len(rows) == p, "%s: %d rows" % (tag, len(rows)))
    return pic, rows


for sched in ("1f1b", "gpipe", "zero_bubble"):
    for p, m in ((2, 4), (4, 8), (4, 2)):
        tag = "schedule gpt2-tiny L=4 pp=%d m=%d %s" % (p, m, sched)
        pic, rows = schedule_rows(p, m, sched, ["-D", "layers=4"], tag)
        for s, row in enumerate(rows):
            got = re.findall(r"[FBW]\d+", row.split("|", 1)[1])
            check(zb_rules(p, m, s, got) if sched == "zero_bubble" else got == order(p, m, s, sched),
                  "%s stage %d: %s" % (tag, s, " ".join(got)))
        _, bubble, _, _ = parse(stats("models/gpt2-tiny.dp", p, p, m, sched, ["-D", "layers=4"]))
        b = re.search(r"^bubble ([0-9.]+) of the stages' time idle", pic, re.M)
        check(b is not None and bubble is not None and abs(float(b.group(1)) - bubble[1]) < 1e-4,
              "%s: bubble %s = --stats' simulated %s" % (tag, b and b.group(1),
                                                         bubble and bubble[1]))



def order_il(p, v, m, r):
    """interleaved's slots on rank r, by hand from Megatron-LM's
    forward_backward_pipelining_with_interleaving (Narayanan et al. 2021,
    2.2): the forwards go through the rank's virtual stages r, r + p, ...
    in turn, p micro-batches on each before the next; the backwards the
    same from its last virtual stage down; 2(p - r - 1) + (v - 1)p warm-up
    forwards (all m*v when m = p), then one forward and one backward in
    turn, then the backwards left. Labels F<micro-batch>.<virtual stage>."""
    def unit(i, fwd):
        group, rnd = i % (p * v), i // (p * v)
        j = group // p if fwd else v - 1 - group // p
        return "%s%d.%d" % ("F" if fwd else "B", rnd * p + group % p, j * p + r)
    total = m * v
    warm = total if m == p else min(2 * (p - r - 1) + (v - 1) * p, total)
    out = [unit(i, True) for i in range(warm)]
    b = 0
    for f in range(warm, total):
        out += [unit(f, True), unit(b, False)]
        b += 1
    return out + [unit(i, False) for i in range(b, total)]


# interleaved (stages_per_rank v): gpt2-tiny with 6 layers (9 blocks) on
# p x v virtual stages. --emit=schedule's rows are the ranks' slots in
# Megatron's order; the bubble's closed form is 1F1B's with its idle divided
# by v, (p-1)/(vm+p-1); the simulated one is never below it and is below
# 1F1B's on the same model; each rank's activations at the peak are
# min(2(p-r-1) + (v-1)p + 1, mv) virtual-stage micro-batches (mv at m = p)
IL_BUBBLE = re.compile(r"^bubble: \(p-1\)/\(v\*m\+p-1\) = ([0-9.]+); from the stages' FLOPs "
                       r"([-0-9.]+)", re.M)
IL_RANK = re.compile(r"^rank (\d+): stages [0-9, ]+; activations at the peak: (\d+) "
                     r"stage-micro-batches in flight \(closed form (\d+)\)", re.M)
for p, v, m in ((2, 2, 4), (4, 2, 8), (2, 3, 2), (4, 2, 4)):
    extra = ["-D", "layers=6", "--set", "train.stages_per_rank=%d" % v]
    tag = "interleaved gpt2-tiny L=6 pp=%d v=%d m=%d" % (p, v, m)
    pic, rows = schedule_rows(p, m, "interleaved", extra, tag)
    for r, row in enumerate(rows):
        got = re.findall(r"[FB]\d+\.\d+", row.split("|", 1)[1])
        check(got == order_il(p, v, m, r), "%s rank %d: %s" % (tag, r, " ".join(got)))
    text = stats("models/gpt2-tiny.dp", p, p, m, "interleaved", extra)
    b = IL_BUBBLE.search(text)
    closed = (p - 1) / (v * m + p - 1)
    check(b is not None and abs(float(b.group(1)) - closed) < 1e-4,
          "%s: bubble %s = (p-1)/(vm+p-1) = %.4f" % (tag, b and b.group(1), closed))
    check(b is not None and float(b.group(2)) >= closed - 1e-4,
          "%s: simulated bubble %s >= closed form %.4f" % (tag, b and b.group(2), closed))
    pb = re.search(r"^bubble ([0-9.]+) of the ranks' time idle", pic, re.M)
    check(pb is not None and b is not None and abs(float(pb.group(1)) - float(b.group(2))) < 1e-4,
          "%s: --emit=schedule's bubble %s = --stats' %s" % (tag, pb and pb.group(1),
                                                            b and b.group(2)))
    _, flat, _, _ = parse(stats("models/gpt2-tiny.dp", p, p, m, "1f1b",
                                ["-D", "layers=6"]))
    check(b is not None and flat is not None and float(b.group(2)) < flat[1],
          "%s: simulated bubble %s < 1f1b's %s" % (tag, b and b.group(2), flat and flat[1]))
    fly = IL_RANK.findall(text)
    want = [m * v if m == p else min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) for r in range(p)]
    check([int(x[1]) for x in fly] == want and [int(x[2]) for x in fly] == want,
          "%s: activations at the peak %s stage-micro-batches per rank, closed form %s"
          % (tag, [x[1] for x in fly], want))

print("pipeline_forms: %d passed, %d failed" % (oks, fails))
sys.exit(1 if fails else 0)
