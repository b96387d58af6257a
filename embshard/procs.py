"""Wait for a group of local processes under one deadline: when it passes, every process of the
group is killed, so one hung rank never leaves the others (or a test) waiting."""

from __future__ import annotations

import subprocess
import time


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> tuple[list[str], bool]:
    """Each process's output (started with ``stdout=PIPE, text=True``) and whether the deadline
    passed (then all were killed)."""
    deadline = time.monotonic() + timeout_s
    logs, timed_out = [], False
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            timed_out = True
            for q in procs:
                q.kill()
            logs.append(p.communicate()[0])
    return logs, timed_out
