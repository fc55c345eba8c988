#!/usr/bin/env python3
"""tests/cuda_emu/compare_serve.py - tests/compare.py for a whole suite in one
process: the emulator's suites compare every run with the CPU's (~300
comparisons), and each `compare.py` started alone spent ~0.2 s of CPU on
Python's and numpy's start-up, more than a small case's emulated run
(tests/cuda_emu/suite.sh's cmp_start and pycmp, docs/CUDA-EMU.md).

Reads one request a line: the output file, then compare.py's words, joined
by the unit separator (0x1f). Runs compare.py's main on them with its
output written to that file (truncated), and answers compare.py's exit
status as a line: 0 or 1, and 2 when it raised (the error's line is then
the file's last, as compare.py's traceback would end).
"""
import contextlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import compare  # noqa: E402 (tests/compare.py)


def serve():
    for line in sys.stdin:
        out, *words = line.rstrip("\n").split("\x1f")
        rc = 0
        with open(out, "w") as f, contextlib.redirect_stdout(f):
            sys.argv = ["compare.py"] + words
            try:
                compare.main()
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except Exception as e:  # a missing or short file
                print(f"compare.py: {type(e).__name__}: {e}")
                rc = 2
        print(rc, flush=True)


if __name__ == "__main__":
    serve()
