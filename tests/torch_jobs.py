#!/usr/bin/python3
"""tests/torch_jobs.py - several PyTorch reference runs in one process.

Importing torch costs ~1.6 CPU-s per process. A suite that runs several
references (tests/torch_gpt.py, tests/torch_ref.py) writes them into a job
file and runs them here, in order, each as `python3 tests/SCRIPT ARGS...`
would run: its own argv and fresh module globals (runpy), its stdout and
stderr (file descriptors 1 and 2, so torch's own messages too) into LOG,
its exit status into LOG.rc (0, 1 for an exception or sys.exit(message),
else sys.exit's code). A job's failure does not stop the next.

  torch_jobs.py JOBFILE     each line: LOG SCRIPT ARGS... (shell words)

Exit status: 0 when every job was run (whatever their own statuses), 2 on
a malformed job file.
"""
import os
import runpy
import shlex
import sys
import traceback


def run(log, script, args):
    """one job: SCRIPT ARGS with fds 1 and 2 on LOG; its exit status"""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    argv = sys.argv
    sys.argv = [script] + args
    try:
        runpy.run_path(script, run_name="__main__")
        rc = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            rc = e.code or 0
        else:  # sys.exit("message"): printed, status 1, as the interpreter does
            print(e.code, file=sys.stderr)
            rc = 1
    except BaseException:  # noqa: B902 (a job's error is its status, not ours)
        traceback.print_exc()
        rc = 1
    finally:
        sys.argv = argv
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
    with open(log + ".rc", "w") as f:
        print(rc, file=f)
    return rc


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: torch_jobs.py JOBFILE (each line: LOG SCRIPT ARGS...)")
    with open(sys.argv[1]) as f:
        jobs = [shlex.split(line) for line in f if line.strip()]
    for i, job in enumerate(jobs):
        if len(job) < 2:
            print(f"torch_jobs: {sys.argv[1]}:{i + 1}: needs LOG SCRIPT [ARGS...]", file=sys.stderr)
            sys.exit(2)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_ref, as a script sees it
    for log, script, *args in jobs:
        run(log, script, args)


if __name__ == "__main__":
    main()
