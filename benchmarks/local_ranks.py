"""Run a benchmark script on N processes, one CPU thread each (shared by the benchmarks): on this host, or
on emulated hosts (embshard/emulated_hosts.py: network namespaces joined by shaped links; needs root)."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping, Sequence

import torch.distributed as dist

from embshard.ports import free_port


def run_script_ranks(script: str, world_size: int, rank_args: Callable[[int, int], list[str]], *,
                     env: Mapping[str, str] | None = None, timeout_s: float | None = None) -> None:
    """`python script *rank_args(rank, port)` on `world_size` processes; RuntimeError if any rank fails."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    procs = [subprocess.Popen([sys.executable, script, *rank_args(r, port)], env=env) for r in range(world_size)]
    _wait(script, procs, timeout_s)


def run_ranks(script: str, args: Sequence[str], *, hosts: int, ranks_per_host: int,
              env: Mapping[str, str] | None = None, timeout_s: float | None = None) -> str:
    """`python script *args` on hosts x ranks_per_host ranks, each with torchrun's variables (`init_rank` joins
    them): hosts=1 on this host, else on emulated hosts with torchrun per host. Returns how the inter-host links
    were shaped ("" on one host); RuntimeError if any rank fails, with the hosts' log tails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if hosts == 1:
        port, world = free_port(), ranks_per_host
        procs = [subprocess.Popen([sys.executable, script, *args], env={
            **env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in range(world)]
        _wait(script, procs, timeout_s)
        return ""
    from embshard.emulated_hosts import EmulatedHosts

    logs = Path(tempfile.mkdtemp(prefix="embshard-bench-hosts-"))
    with EmulatedHosts(hosts) as cluster:
        exits = cluster.wait(cluster.torchrun(ranks_per_host, [script, *args], env, logs), timeout_s or 10 ** 6)
        if any(e.returncode != 0 for e in exits):
            tails = "\n".join(f"--- host {e.host} (exit {e.returncode}):\n{e.log.read_text()[-3000:]}" for e in exits)
            raise RuntimeError(f"{script}: a host failed, exits {[e.returncode for e in exits]}\n{tails}")
        return cluster.shaping


def init_rank(timeout_s: float = 600) -> tuple[int, int, int]:
    """Join the gloo group of `run_ranks` (torchrun's variables): (rank, world size, ranks per host)."""
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_WORLD_SIZE"])


def _wait(script: str, procs: list[subprocess.Popen], timeout_s: float | None) -> None:
    try:
        codes = [p.wait(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise RuntimeError(f"{script}: a rank failed, exit codes {codes}")
