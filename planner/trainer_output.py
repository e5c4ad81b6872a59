"""Running the trainer under torchrun on this machine: its one-line error last, not torchrun's report.

When a rank stops on a user mistake it prints one line, `sailor: error: ...`
(every rank may print the same one), and exits 2. torchrun then logs the
failure and raises its own ChildFailedError: forty lines of traceback and a
table that bury the line that matters. Here torchrun's stderr is read line by
line: the ranks' lines pass through as they come, torchrun's own log lines and
failure report are held back, and at the end the trainer's error (each
distinct line once) is the last thing printed and the exit code is 2. Without
such a line (a crash) the held report is printed, since it says which rank
died and how.
"""
from __future__ import annotations

import re
import subprocess
import sys

from planner.flags import require_module

TORCH_LOG = re.compile(r"^[DIWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S*torch/distributed/")
FAILED = "failed (exitcode"
ERROR = "sailor: error: "


def run_trainer(cmd: list[str], env: dict) -> int:
    """Run torchrun (`cmd`); returns 2 after a trainer's user error, else torchrun's exit code."""
    require_module("torch", "runtime", "sailor launch --local")
    require_module("megatron.core", "runtime", "sailor launch --local")
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
    held, errors, reporting = [], [], False
    try:
        for line in proc.stderr:
            if reporting or TORCH_LOG.match(line):
                held.append(line)
                reporting = reporting or FAILED in line
            elif line.startswith(ERROR):
                if line not in errors:
                    errors.append(line)
            else:
                sys.stderr.write(line)
                sys.stderr.flush()
        code = proc.wait()
    except KeyboardInterrupt:
        proc.wait()
        raise
    if code != 0 and errors:
        sys.stderr.writelines(errors)
        return 2
    sys.stderr.writelines(held + errors)
    return code
