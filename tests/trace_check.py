#!/usr/bin/python3
"""trace_check.py TRACE.json RANKS STEPS [LOG] - the checks of tests/trace.sh on a
dpexec --trace file (runtime/trace.c says what the spans are). Prints one line
of counts on success; exits 1 with the first problem otherwise.

With LOG (dpexec's output of a --device cuda run, tests/cuda_emu.sh) the
device lanes too (tid 100 + stream): every span there marked device, on its
own stream's lane; per rank, step and micro-batch every step-program
instruction of the host lanes once on the device lanes and nothing else;
and the summary in LOG adds up: its classes and its streams each sum to its
instruction total, which is rank 0's device spans' sum; at most 15 top ops,
in order."""
import collections
import json
import re
import sys


def fail(msg):
    print(msg)
    sys.exit(1)


DEV_TID = 100
STREAMS = ["compute", "comm", "copy", "p2p"]


def device_checks(spans, names, log, ranks):
    dev = [e for e in spans if e["tid"] >= DEV_TID]
    if not dev:
        fail("no spans on a device lane")
    per = collections.defaultdict(lambda: ([], []))  # (pid, step, micro) -> host, device instrs
    used = set()
    for e in spans:
        d = e["tid"] >= DEV_TID
        if d != bool(e["args"].get("device")):
            fail(f"a span on lane {e['tid']} marked device={e['args'].get('device')}: {e}")
        if d and e["cat"] != "run" and e["args"]["stream"] != STREAMS[e["tid"] - DEV_TID]:
            fail(f"an instruction of stream {e['args']['stream']} on the device lane of "
                 f"{STREAMS[e['tid'] - DEV_TID]}: {e}")
        if e["cat"] != "run" and e["args"]["program"] == "step":
            per[(e["pid"], e["args"]["step"], e["args"]["micro"])][d].append(e["args"]["instr"])
            if d:
                used.add(e["args"]["stream"])
    for key, (host, device) in per.items():
        if sorted(device) != sorted(host) or len(set(device)) != len(device):
            fail(f"rank, step, micro {key}: device lanes' instructions {sorted(device)[:12]}... "
                 f"not the walk's {sorted(host)[:12]}... once each")
    if ranks > 1 and "comm" not in used:
        fail("no instruction on the comm stream's device lane at several ranks")
    druns = [e for e in dev if e["cat"] == "run"]
    hruns = [e for e in spans if e["tid"] < DEV_TID and e["cat"] == "run"]
    if len(druns) != len(hruns):
        fail(f"{len(druns)} runs on the device lanes, {len(hruns)} on the host's")
    # the summary (rank 0's) against rank 0's device spans
    # (dpexec's lines start with their UTC time)
    text = [re.sub(r"^[0-9][0-9-]*T[0-9:.]*Z ", "", ln) for ln in open(log).read().splitlines()]
    tot = [ln for ln in text if ln.startswith("trace: instructions ")]
    cls = [ln for ln in text if ln.startswith("trace: by class")]
    top = [ln.split() for ln in text if re.match(r"trace: +[0-9]+ ", ln)]
    if len(tot) != 1 or len(cls) != 1 or not top:
        fail(f"no summary in {log}")
    m = re.match(r"trace: instructions ([0-9.]+) ms: compute ([0-9.]+), comm ([0-9.]+), "
                 r"copy ([0-9.]+), p2p ([0-9.]+);", tot[0])
    total = float(m.group(1))
    parts = [float(x) for x in re.findall(r" [a-z]+ ([0-9.]+) \(", cls[0])]
    spent = sum(e["dur"] for e in dev if e["pid"] == 0 and e["cat"] != "run" and
                e["args"]["program"] == "step") / 1e3
    slack = 2e-3 * (len(parts) + 3) + 1e-4 * total
    if abs(sum(parts) - total) > slack or \
            abs(sum(float(m.group(k)) for k in (2, 3, 4, 5)) - total) > slack:
        fail(f"the summary does not add up: classes {sum(parts):.3f}, streams, total {total:.3f}")
    if abs(spent - total) > slack + 1e-3 * len(dev):
        fail(f"the summary's total {total:.3f} ms is not rank 0's device spans' {spent:.3f} ms")
    ms = [float(t[4]) for t in top]
    if len(top) > 15 or ms != sorted(ms, reverse=True) or max(ms) > total + slack:
        fail(f"the top ops: {len(top)} lines, not in order or above the total")
    print(f"device lanes: {len(per)} (rank, step, micro) runs, each instruction once on "
          f"streams {sorted(used)}; summary: {len(parts)} classes sum to {sum(parts):.3f} ms = "
          f"total {total:.3f} ms = rank 0's device spans {spent:.3f} ms; top {len(top)}; ", end="")


def main():
    path, ranks, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with open(path) as f:
        doc = json.load(f)
    events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        fail("no traceEvents list")
    names = {}
    spans = []
    for e in events:
        if e.get("ph") == "M":
            names[(e["pid"], e.get("tid"), e["name"])] = e["args"]["name"]
            continue
        if e.get("ph") != "X":
            fail(f"an event that is not a span: {e}")
        if e["ts"] < 0 or e["dur"] < 0:
            fail(f"negative time: {e}")
        spans.append(e)
    pids = sorted({e["pid"] for e in spans})
    if pids != list(range(ranks)):
        fail(f"ranks {pids}, expected 0..{ranks - 1}")
    for e in spans:
        if (e["pid"], None, "process_name") not in names or \
                (e["pid"], e["tid"], "thread_name") not in names:
            fail(f"a span on an unnamed rank or lane: {e}")
    # nesting: per lane, sorted by start (longer first), every span inside
    # the enclosing open one or after it
    lanes = collections.defaultdict(list)
    for e in spans:
        lanes[(e["pid"], e["tid"])].append(e)
    eps = 1e-3  # the file's microseconds have 3 decimals
    for key, lst in lanes.items():
        lst.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []
        for e in lst:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"] + eps:
                stack.pop()
            if stack and e["ts"] + e["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + eps:
                fail(f"spans cross on lane {key}: {stack[-1]['name']} and {e['name']}")
            stack.append(e)
    device = len(sys.argv) > 4
    if device:
        device_checks(spans, names, sys.argv[4], ranks)
        spans = [e for e in spans if e["tid"] < DEV_TID]
        lanes = {k: v for k, v in lanes.items() if k[1] < DEV_TID}
    # runs and their instructions, in program order and in time
    ncoll = nwait = 0
    for pid in pids:
        compute = sorted(lanes[(pid, 0)], key=lambda e: (e["ts"], -e["dur"]))
        runs = [e for e in compute if e["cat"] == "run"]
        step_runs = [r for r in runs if r["args"]["program"] == "step"]
        if len(step_runs) < steps:
            fail(f"rank {pid}: {len(step_runs)} step program runs, expected >= {steps}")
        for r in runs:
            inner = [e for e in compute if e["cat"] != "run" and
                     r["ts"] - eps <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] + eps]
            order = [e["args"]["instr"] for e in inner]
            if order != sorted(order) or len(set(order)) != len(order):
                fail(f"rank {pid}, {r['name']}: instructions out of program order: {order[:20]}")
            if r["args"]["program"] == "step" and not inner:
                fail(f"rank {pid}, {r['name']}: no instruction spans")
        colls = [e for (p, t), lst in lanes.items() if p == pid and t > 0 for e in lst]
        waits = [e for e in compute if e["cat"] == "wait"]
        if ranks > 1 and not device:  # (device: NCCL's, on the comm device lane)
            if not colls:
                fail(f"rank {pid}: no collectives on a comm lane")
            for c in colls:
                if c["cat"] != "collective" or c["args"].get("bytes", 0) <= 0 or \
                        not any(a in c["args"].get("axes", "") for a in ("dp_", "pp")):
                    fail(f"rank {pid}: a comm-lane span without bytes and axes: {c}")
            if not waits:
                fail(f"rank {pid}: no wait spans")
        ncoll += len(colls)
        nwait += len(waits)
    ninstr = sum(1 for e in spans if e["cat"] not in ("run",))
    print(f"{len(spans)} spans parse, nest and are ordered ({ninstr} instructions, "
          f"{ncoll} collectives, {nwait} waits)")


if __name__ == "__main__":
    main()
