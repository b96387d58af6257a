"""Spawn a real gloo group (one OS process per rank) and collect every rank's case results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from embshard.ports import free_port
from embshard.procs import wait_all

WORKER = Path(__file__).resolve().parent / "rt_worker.py"
REPO = Path(__file__).resolve().parents[2]


def run_group(world_size: int, timeout_s: float, only: str = "") -> list[dict]:
    """Results of every case on every rank ([rank] -> {case: metrics}); ranks are killed at the timeout."""
    out_dir = Path(tempfile.mkdtemp(prefix=f"embshard-w{world_size}-"))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, str(WORKER), "--world-size", str(world_size), "--rank", str(r),
                          "--port", str(port), "--out", str(out_dir / f"rank{r}.json"), "--only", only],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world_size)
    ]
    logs, _ = wait_all(procs, timeout_s)
    results = []
    for r, p in enumerate(procs):
        path = out_dir / f"rank{r}.json"
        results.append(json.loads(path.read_text()) if path.exists() else {})
        if p.returncode != 0:
            results[-1]["__exit__"] = {"error": f"rank {r} exited with {p.returncode}:\n{logs[r][-4000:]}"}
    return results
