#!/usr/bin/env python3
"""tests/compare.py - compare two dp runs numerically (numpy only).

  compare.py losses A.txt B.txt --rtol R --atol A     loss columns of `dpexec --losses`
  compare.py params A.safetensors B.safetensors --rtol R --atol A
  compare.py updates INIT.safetensors A.safetensors B.safetensors --rtol R
      the training updates A - INIT and B - INIT: |(A-INIT) - (B-INIT)| <= R |B-INIT|
      over all tensors together (2-norms; bf16 runs: tests/bf16.sh says why)

Prints the largest differences and exits 1 when a value differs by more than
atol + rtol * |reference| (B is the reference).

  compare.py COMPARISON --and COMPARISON ...
      each in turn, as `compare.py A && compare.py B` would run them (the
      first that fails ends it), in one process: one numpy start-up
"""
import json
import struct
import sys

import numpy as np


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (path, name, info["dtype"])
        b, e = info["data_offsets"]
        out[name] = np.frombuffer(data[base + b : base + e], dtype="<f4").reshape(info["shape"])
    return out


def read_losses(path):
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                rows.append([float(t) for t in line.split()])
    return np.array(rows)


def close(name, a, b, rtol, atol):
    if a.shape != b.shape:
        print(f"{name}: shape {a.shape} vs {b.shape}")
        return False
    err = np.abs(a.astype(np.float64) - b.astype(np.float64))
    lim = atol + rtol * np.abs(b.astype(np.float64))
    worst = float(np.max(err - lim)) if err.size else 0.0
    rel = float(np.max(err / (np.abs(b) + 1e-12))) if err.size else 0.0
    print(f"  {name}: max abs diff {float(err.max()) if err.size else 0:.3e}, max rel {rel:.3e}"
          + ("" if worst <= 0 else "  EXCEEDS TOLERANCE"))
    return worst <= 0


def updates(init, a, b, rtol):
    """The 2-norm of the difference of two runs' updates, relative to B's."""
    p0, pa, pb = read_safetensors(init), read_safetensors(a), read_safetensors(b)
    if sorted(pa) != sorted(pb) or sorted(p0) != sorted(pb):
        print(f"tensor names differ: {sorted(pa)} vs {sorted(pb)}")
        return False
    num = den = 0.0
    for k in sorted(pb):
        da = pa[k].astype(np.float64) - p0[k]
        db = pb[k].astype(np.float64) - p0[k]
        num += float(((da - db) ** 2).sum())
        den += float((db ** 2).sum())
    rel = (num / den) ** 0.5 if den > 0 else float("inf")
    print(f"  updates: relative difference {rel:.3e} (2-norm over every tensor)"
          + ("" if rel <= rtol else "  EXCEEDS TOLERANCE"))
    return rel <= rtol


def one(argv):
    """one comparison (argv: the words after compare.py); True when it holds"""
    kind, a, b = argv[0:3]
    if kind == "updates":
        rtol = float(argv[argv.index("--rtol") + 1])
        return updates(a, b, argv[3], rtol)
    rtol = float(argv[argv.index("--rtol") + 1]) if "--rtol" in argv else 1e-5
    atol = float(argv[argv.index("--atol") + 1]) if "--atol" in argv else 1e-6
    good = True
    if kind == "losses":
        la, lb = read_losses(a), read_losses(b)
        if la.shape[0] != lb.shape[0] or la.shape[0] == 0:
            print(f"step count {la.shape[0]} vs {lb.shape[0]}")
            return False
        good = close("loss", la[:, 1], lb[:, 1], rtol, atol)
    else:
        pa, pb = read_safetensors(a), read_safetensors(b)
        if sorted(pa) != sorted(pb):
            print(f"tensor names differ: {sorted(pa)} vs {sorted(pb)}")
            return False
        for k in sorted(pa):
            good &= close(k, pa[k], pb[k], rtol, atol)
    return good


def main():
    argv, start = sys.argv[1:], 0
    for i, w in enumerate(argv + ["--and"]):
        if w == "--and":
            sys.stdout.flush()
            if not one(argv[start:i]):
                sys.exit(1)
            start = i + 1
    sys.exit(0)


if __name__ == "__main__":
    main()
