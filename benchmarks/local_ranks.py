"""Run a benchmark script on N local processes, one CPU thread each (shared by the benchmarks)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable, Mapping

from embshard.ports import free_port


def run_script_ranks(script: str, world_size: int, rank_args: Callable[[int, int], list[str]], *,
                     env: Mapping[str, str] | None = None, timeout_s: float | None = None) -> None:
    """`python script *rank_args(rank, port)` on `world_size` processes; RuntimeError if any rank fails."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    procs = [subprocess.Popen([sys.executable, script, *rank_args(r, port)], env=env) for r in range(world_size)]
    try:
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise RuntimeError(f"{script}: a rank failed, exit codes {codes}")
