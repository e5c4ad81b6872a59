"""Helpers of the profiler tests (imported by them and by conftest.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICK = ("--warmup", "1", "--repeats", "3")  # enough to exercise the code, not to measure well


def sailor(*args, cwd=ROOT, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`sailor ARGS` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "planner.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})})


def one_line_error(run: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit 2, nothing on stdout, one `sailor: error:` line naming the problem."""
    assert run.returncode == 2, (run.returncode, run.stdout[-2000:], run.stderr[-2000:])
    assert run.stdout == "", run.stdout
    assert run.stderr.startswith("sailor: error: ") and run.stderr.count("\n") == 1, run.stderr
    for needle in needles:
        assert needle in run.stderr, run.stderr
