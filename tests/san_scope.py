#!/usr/bin/python3
"""tests/san_scope.py - which cases the SAN=1 variant runs, chosen by coverage.

What ASan and UBSan find (memory errors, undefined behaviour) lives in the
code a case executes, and most SAN=1 cases execute code that other cases
already ran under the sanitizers (one strategy at 1, 2 and 4 ranks; one
model with another knob). So the SAN=1 variant runs a set of cases that
covers every arc any case covers, and leaves out the rest.

  san_scope.py choose BUILD_COV -o tests/san-scope.txt
      (`make san-scope`) read the coverage run's counters, BUILD_COV/cov/
      SUITE/cN/**.gcda (case N of BUILD_COV/cov/SUITE/cases; "setup": the
      suite's work outside its cases, which SAN=1 always runs) and each
      case's CPU seconds (BUILD_COV/test-logs/SUITE.cases), choose, assert
      that the chosen set covers what the whole set covers, write the file.
  san_scope.py check [FILE]
      FILE (default tests/san-scope.txt) is well-formed and every case it
      names exists (each suite's LIST=1); tests/san_scope.sh runs it.
  san_scope.py redundant BUILD_COV SAN_LOGS
      between two remakes: over a coverage run of some suites
      (BUILD=BUILD_COV DP_COV_DIR=BUILD_COV/cov SUITE=... bash tests/run.sh),
      the cases tests/san-scope.txt runs under SAN=1 (marked in, or not
      named) whose every arc the set-ups and the other such cases of those
      suites cover, the costliest first by SAN_LOGS/SUITE.cases (a SAN=1
      run's), each chosen with those chosen before it out: what may be
      marked out by hand (the file's '# by hand' lines).

Items. gcc's --coverage counts the arcs of each function's control-flow
graph that are not on its spanning tree (the others follow from them); an
item is one counted arc, (object, function, counter), and a case covers it
when its count is non-zero after the case. Parsed from the .gcda files
directly (gcc 12's format: gcc/gcov-io.h), ~1800 cases in seconds.

Choice. Greedy set cover: the always-run work (each suite's set-up, the
fuzzers, the cases kept in for a reason below) first, then, while an item
is left, the case with the most new items per CPU second (its seconds in the
coverage run, 0.05 s at least). Kept in whatever their coverage: the
fuzzers (their worth is random inputs, not lines: stepfile_fuzz and the
fuzz cases of unit and errors), a case that failed in the coverage run
(measured wrong), a case LIST=1 names that the coverage run did not run
(not measured). A case not in the file at all (added after it was made)
runs under SAN=1: tests/lib.sh.
"""
import glob
import os
import re
import struct
import subprocess
import sys
import time
import heapq

TAG_FUNCTION = 0x01000000
TAG_ARCS = 0x01A10000
# cases whose worth is not their lines: run under SAN=1 whatever their coverage
ALWAYS = [
    ("stepfile_fuzz", r".*"),  # the decoder's fuzzers
    ("*", r".*fuzz.*"),  # unit's stepfile_fuzz, errors' and passes' fe_fuzz, durability's ckpt_fuzz
]
# suites run as one case of another (tests/run.sh's INSIDE): all of the
# inner suite's coverage is that case's, and the scope file names the case
INSIDE = {"settings": ("errors", "settings")}
# suites the coverage run leaves out (one SKIP under SAN=1: tests/lib.sh's emu_start)
NOT_RUN = {"cuda_emu", "cuda_emu_mutations", "gpu_kit"}


def gcda_arcs(path):
    """[(function ident, [counter indices with a non-zero count])] of one .gcda"""
    with open(path, "rb") as f:
        b = f.read()
    if b[:4] != b"adcg":
        raise SystemExit(f"san_scope: {path}: not a little-endian gcda file")
    pos = 16  # magic, version, stamp, checksum (gcc 12)
    out = []
    ident = None
    n = len(b)
    while pos + 8 <= n:
        tag, length = struct.unpack_from("<Ii", b, pos)
        pos += 8
        if tag == TAG_FUNCTION:
            ident = struct.unpack_from("<I", b, pos)[0] if length >= 4 else None
        elif tag == TAG_ARCS:
            if length < 0:  # every counter zero: -length bytes of them
                out.append((ident, -length // 8, []))
                continue
            k = length // 8
            vals = struct.unpack_from(f"<{k}q", b, pos)
            out.append((ident, k, [i for i, v in enumerate(vals) if v]))
        if length > 0:
            pos += length
    return out


class Sums:
    """the counters of several cases summed, object by object, written back
    as .gcda files beside copies of their .gcno: gcov's line counts of what
    those cases executed together"""

    def __init__(self):
        self.obj = {}  # object -> [header, [(tag, bytes or counters)]]

    def add(self, path, obj):
        import numpy as np
        with open(path, "rb") as f:
            b = f.read()
        recs = []
        pos, n = 16, len(b)
        while pos + 8 <= n:
            tag, length = struct.unpack_from("<Ii", b, pos)
            pos += 8
            if tag == TAG_ARCS:
                if length < 0:
                    recs.append((tag, np.zeros(-length // 8, dtype=np.int64)))
                    continue
                recs.append((tag, np.frombuffer(b, dtype="<i8", count=length // 8, offset=pos).astype(np.int64)))
            else:
                recs.append((tag, b[pos:pos + max(length, 0)]))
            pos += max(length, 0)
        if obj not in self.obj:
            self.obj[obj] = [b[:16], recs]
            return
        old = self.obj[obj][1]
        if [t for t, _ in old] != [t for t, _ in recs]:
            raise SystemExit(f"san_scope: {path}: its records differ from another case's {obj}")
        for i, (t, v) in enumerate(recs):
            if t == TAG_ARCS:
                old[i] = (t, old[i][1] + v)

    def lines(self, build, tmp):
        """{(source, line)} that gcov counts as executed"""
        import json
        import shutil
        tmp = os.path.abspath(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        files = []
        for obj, (head, recs) in self.obj.items():
            out = os.path.join(tmp, obj)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(head)
                for t, v in recs:
                    payload = v if isinstance(v, bytes) else v.astype("<i8").tobytes()
                    f.write(struct.pack("<II", t, len(payload)) + payload)
            gcno = os.path.join(os.path.dirname(build.rstrip("/")), obj)[:-5] + ".gcno"
            shutil.copy(gcno, out[:-5] + ".gcno")
            files.append(out)
        r = subprocess.run(["gcov", "--stdout", "--json-format"] + files, capture_output=True, text=True,
                           cwd=tmp)
        if r.returncode:
            raise SystemExit(f"san_scope: gcov failed: {r.stderr[-2000:]}")
        ran = set()
        for doc in r.stdout.splitlines():
            if not doc.startswith("{"):
                continue
            for f in json.loads(doc)["files"]:
                for ln in f["lines"]:
                    if ln["count"]:
                        ran.add((f["file"], ln["line_number"]))
        shutil.rmtree(tmp, ignore_errors=True)
        return ran


class Items:
    """numbers for items: (object, function, counter) -> bit"""

    def __init__(self):
        self.base = {}  # (object, function) -> (first bit, counters)
        self.total = 0

    def bits(self, obj, fn, k, idx):
        key = (obj, fn)
        if key not in self.base:
            self.base[key] = (self.total, k)
            self.total += k
        b0, k0 = self.base[key]
        if k0 != k:
            raise SystemExit(f"san_scope: {obj}: function {fn} has {k} counters here, {k0} elsewhere (two builds mixed?)")
        return [b0 + i for i in idx]


def covered(d, items, root, sums=None):
    """the set of items (as an int's bits) of the .gcda files under d (and
    their counters added to sums)"""
    bits = []
    for p in glob.glob(os.path.join(d, "**", "*.gcda"), recursive=True):
        rel = os.path.relpath(p, root).split(os.sep, 2)[2]  # the object (under SUITE/CASE-DIR/)
        if sums is not None:
            sums.add(p, rel)
        for fn, k, idx in gcda_arcs(p):
            bits.extend(items.bits(rel, fn, k, idx))
    m = 0
    if bits:
        ba = bytearray((max(bits) >> 3) + 1)
        for i in bits:
            ba[i >> 3] |= 1 << (i & 7)
        m = int.from_bytes(ba, "little")
    return m


def suites():
    """the suites (tests/*.sh but the library, runner and demos), sorted"""
    out = []
    for p in sorted(glob.glob("tests/*.sh")):
        n = os.path.basename(p)[:-3]
        if n not in ("lib", "run", "demo", "demo_gpt") and n not in INSIDE:
            out.append(n)
    return out


def list_cases(suite):
    # (not timed, nor counted: the suite's case times and counters are its own runs')
    env = {k: v for k, v in os.environ.items() if k not in ("DP_CASE_TIMES", "DP_COV_DIR", "CASE")}
    r = subprocess.run(["bash", f"tests/{suite}.sh"], env=dict(env, DP_LIST="1"),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True)
    names = []
    for line in r.stdout.splitlines():
        if line.startswith("  case "):
            names.append(line[len("  case "):])
    return names


def case_secs(logs, suite):
    """{case: CPU seconds} from a run's SUITE.cases ("WALL CPU NAME" lines)"""
    secs = {}
    try:
        with open(os.path.join(logs, suite + ".cases")) as f:
            for line in f:
                p = line.rstrip("\n").split(None, 2)
                if len(p) == 3 and p[2] != "-":
                    secs[p[2]] = secs.get(p[2], 0.0) + float(p[1])
    except FileNotFoundError:
        pass
    return secs


def always(suite, case):
    return any(s in (suite, "*") and re.fullmatch(g, case) for s, g in ALWAYS)


def choose(build, out):
    t0 = time.time()
    os.environ["BUILD"] = build  # (a suite's LIST=1 may look for its binaries)
    root = os.path.join(build, "cov")
    logs = os.path.join(build, "test-logs")
    items = Items()
    cases = []  # (suite, name, mask or None, cpu, why-in or None, counter dirs)
    setups = []  # the suites' set-up counter dirs
    full_sums = Sums()
    base = 0  # what SAN=1 runs whatever the choice: set-ups, kept-in cases
    notes = []
    for suite in suites():
        if suite in NOT_RUN:
            continue
        listed = list(dict.fromkeys(list_cases(suite)))  # (a name a suite starts twice: one line)
        d = os.path.join(root, suite)
        num = {}
        if os.path.exists(os.path.join(d, "cases")):
            with open(os.path.join(d, "cases")) as f:
                for line in f:
                    n, name = line.rstrip("\n").split("\t", 1)
                    num[name] = n
        failed = set()
        if os.path.exists(d + ".failed"):
            with open(d + ".failed") as f:
                failed = {line.rstrip("\n") for line in f}
        secs = case_secs(logs, suite)
        # a failure outside any case, or a suite that ended badly without a
        # FAIL (killed): every case of it is kept in
        rc = "0"
        if os.path.exists(os.path.join(logs, suite + ".rc")):
            with open(os.path.join(logs, suite + ".rc")) as f:
                rc = (f.read().split() or ["1"])[0]
        broke = "" in failed or (rc != "0" and not failed)
        if broke and num:
            notes.append(f"{suite}: failed outside a case in the coverage run (exit {rc}); its cases are in")
        if os.path.isdir(os.path.join(d, "setup")):
            setups.append(os.path.join(d, "setup"))
            base |= covered(setups[-1], items, root, full_sums)
        if not num:
            notes.append(f"{suite}: not run in the coverage run; its cases are in")
        for name in listed:
            why = None
            dirs = [os.path.join(d, "c" + num[name])] if name in num else []
            for inner, (outer, oc) in INSIDE.items():
                if (suite, name) == (outer, oc) and dirs:
                    dirs.append(os.path.join(root, inner))
            mask = None
            for cd in dirs:
                mask = (mask or 0) | covered(cd, items, root, full_sums)
            if always(suite, name):
                why = "kept"
            elif name in failed or broke:
                why = "failed"
            elif name not in num:
                why = "unmeasured"
            cases.append([suite, name, mask, secs.get(name, 0.0), why, dirs])
            if why and mask:
                base |= mask
    full = base
    for c in cases:
        if c[2]:
            full |= c[2]
    # greedy: most new items per CPU second first (lazy: a gain only shrinks)
    cov = base
    heap = []
    for i, c in enumerate(cases):
        if c[4] is None and c[2]:
            g = (c[2] & ~cov).bit_count()
            if g:
                heapq.heappush(heap, (-g / max(c[3], 0.05), i, g))
    chosen = set()
    while heap:
        neg, i, g = heapq.heappop(heap)
        g2 = (cases[i][2] & ~cov).bit_count()
        if g2 == 0:
            continue
        if g2 != g:
            heapq.heappush(heap, (-g2 / max(cases[i][3], 0.05), i, g2))
            continue
        chosen.add(i)
        cov |= cases[i][2]
    if cov != full:
        raise SystemExit("san_scope: the chosen cases do not cover what all cases cover")
    # the lines gcov counts as executed, by every case and by those marked in
    in_sums = Sums()
    for sd in setups:
        covered(sd, Items(), root, in_sums)
    for i, c in enumerate(cases):
        if c[4] or i in chosen:
            for cd in c[5]:
                covered(cd, Items(), root, in_sums)
    lines_all = full_sums.lines(build, os.path.join(build, "cov-sum"))
    lines_in = in_sums.lines(build, os.path.join(build, "cov-sum"))
    missed = sorted(lines_all - lines_in)
    for f, ln in missed[:20]:
        print(f"san_scope: {f}:{ln}: executed by a case marked out only")
    n_all = full.bit_count()
    n_base = base.bit_count()
    cpu_all = sum(c[3] for c in cases)
    cpu_in = sum(c[3] for i, c in enumerate(cases) if c[4] or i in chosen)
    ins = sum(1 for i, c in enumerate(cases) if c[4] or i in chosen)
    why_n = {}
    for c in cases:
        if c[4]:
            why_n[c[4]] = why_n.get(c[4], 0) + 1
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# tests/san-scope.txt - the cases the SAN=1 variant runs (in) and leaves to the",
        "# plain variant (out), chosen by coverage: made by `make san-scope`",
        "# (tests/san_scope.py's header says how), do not edit by hand but to delete",
        "# the line of a case that is gone, or to mark out a case a coverage run of",
        "# some suites showed covered by the cases marked in (a '# by hand' line says which).",
        f"# made {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} from commit {commit}"
        f" (the tree may have had changes), in {time.time() - t0:.0f} s",
        f"# arcs (gcc's counted arcs, non-zero in some case or set-up): {n_all} of {items.total};"
        f" the set-ups and kept-in cases alone: {n_base}; the cases marked in: {n_all} (asserted)",
        f"# source lines executed (gcov, each set's counters summed): {len(lines_all)} by all cases,"
        f" {len(lines_in)} by the set-ups and the cases marked in" + (" (asserted)" if not missed else ""),
        f"# cases: {ins} in of {len(cases)} ({len(chosen)} chosen by the cover; "
        + ", ".join(f"{n} {w}" for w, n in sorted(why_n.items())) + ");"
        f" their CPU in the coverage run: {cpu_in:.0f} s of {cpu_all:.0f} s",
        "# remake: make san-scope (the coverage build, ~25 min of 2 CPUs, then this script)",
    ]
    lines += [f"# {n}" for n in notes]
    lines.append("# SUITE in|out CASE")
    for i, c in enumerate(cases):
        lines.append(f"{c[0]} {'in' if c[4] or i in chosen else 'out'} {c[1]}")
    with open(out + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(out + ".tmp", out)
    print("\n".join(l for l in lines if l.startswith("#")))


def check(path):
    bad = []
    seen = set()
    known = {}
    with open(path) as f:
        text = f.read().splitlines()
    # each named suite's cases (LIST=1), four suites at a time
    from concurrent.futures import ThreadPoolExecutor
    named = sorted({l.split(" ", 1)[0] for l in text if l and not l.startswith("#")})
    named = [n for n in named if os.path.exists(f"tests/{n}.sh")]
    with ThreadPoolExecutor(4) as pool:
        for n, cases in zip(named, pool.map(list_cases, named)):
            known[n] = set(cases)
    for no, line in enumerate(text, 1):
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"(\S+) (in|out) (.+)", line)
        if not m:
            bad.append(f"{path}:{no}: not 'SUITE in|out CASE': {line!r}")
            continue
        s, _, name = m.groups()
        if s not in known:
            bad.append(f"{path}:{no}: no suite {s} (tests/{s}.sh)")
        elif name not in known[s]:
            bad.append(f"{path}:{no}: {s} has no case {name!r} (delete the line, or `make san-scope`)")
        if (s, name) in seen:
            bad.append(f"{path}:{no}: {s} {name!r} a second time")
        seen.add((s, name))
    for b in bad:
        print(b)
    if not seen:
        bad.append(f"{path}: no cases")
        print(bad[-1])
    if bad:
        sys.exit(1)
    print(f"{path}: {len(seen)} cases of {len(known)} suites, every one there")


def redundant(build, san_logs, scope="tests/san-scope.txt", least=0.8):
    """(the usage above) print "CPU-S SUITE CASE" of each case that may go out"""
    root = os.path.join(build, "cov")
    marked = {}
    with open(scope) as f:
        for line in f:
            m = re.fullmatch(r"(\S+) (in|out) (.+)", line.rstrip("\n"))
            if m:
                marked[(m.group(1), m.group(3))] = m.group(2)
    items = Items()
    setups, masks, secs = 0, {}, {}
    for suite in sorted(os.listdir(root)):
        d = os.path.join(root, suite)
        if not os.path.isfile(os.path.join(d, "cases")):
            continue
        if os.path.isdir(os.path.join(d, "setup")):
            setups |= covered(os.path.join(d, "setup"), items, root)
        for name, t in case_secs(san_logs, suite).items():
            secs[(suite, name)] = t
        with open(os.path.join(d, "cases")) as f:
            for line in f:
                n, name = line.rstrip("\n").split("\t", 1)
                cd = os.path.join(d, "c" + n)
                if marked.get((suite, name), "in") != "in":
                    continue
                m = covered(cd, items, root) if os.path.isdir(cd) else 0
                if always(suite, name):  # (never out: its arcs are the set-ups')
                    setups |= m
                else:
                    masks[(suite, name)] = masks.get((suite, name), 0) | m
    cur = set(masks)
    while True:
        for k in sorted(cur, key=lambda k: -secs.get(k, 0)):
            if secs.get(k, 0) < least:
                return
            rest = setups
            for o in cur:
                if o != k:
                    rest |= masks[o]
            if not masks[k] & ~rest:
                print(f"{secs.get(k, 0):6.1f} {k[0]} {k[1]}")
                cur.discard(k)
                break
        else:
            return


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    a = sys.argv[1:]
    if a[:1] == ["choose"] and len(a) == 4 and a[2] == "-o":
        choose(a[1], a[3])
    elif a[:1] == ["check"] and len(a) <= 2:
        check(a[1] if len(a) == 2 else "tests/san-scope.txt")
    elif a[:1] == ["redundant"] and len(a) == 3:
        redundant(a[1], a[2])
    else:
        sys.exit("usage: san_scope.py choose BUILD_COV -o FILE | check [FILE] | redundant BUILD_COV SAN_LOGS")
