#!/usr/bin/python3
"""trace_check.py TRACE.json RANKS STEPS - the checks of tests/trace.sh on a
dpexec --trace file (runtime/trace.c says what the spans are). Prints one line
of counts on success; exits 1 with the first problem otherwise."""
import collections
import json
import sys


def fail(msg):
    print(msg)
    sys.exit(1)


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
        if ranks > 1:
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
