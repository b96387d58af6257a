"""Run a benchmark script on N processes, one CPU thread each (shared by the benchmarks): on this host, or
on emulated hosts (embshard/emulated_hosts.py: network namespaces joined by shaped links; needs root)."""

from __future__ import annotations

import argparse
import datetime
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import torch.distributed as dist

from embshard.ports import free_port


def run_script_ranks(script: str, world_size: int, rank_args: Callable[[int, int], list[str]], *,
                     env: Mapping[str, str] | None = None, timeout_s: float | None = None) -> None:
    """`python script *rank_args(rank, port)` on `world_size` processes; RuntimeError if any rank fails."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    procs = [subprocess.Popen([sys.executable, script, *rank_args(r, port)], env=env) for r in range(world_size)]
    _wait(script, procs, timeout_s)


@dataclass(frozen=True)
class Hosts:
    """Where a benchmark's ranks run: ``hosts`` x ``ranks_per_host``; with hosts > 1 on emulated hosts whose links
    are shaped to ``link_gbit`` each way plus ``delay_ms`` (plans_measured.py's multi-host flags, same meaning)."""
    hosts: int
    ranks_per_host: int
    link_gbit: float = 2.0
    delay_ms: float = 0.1

    @property
    def world_size(self) -> int:
        return self.hosts * self.ranks_per_host

    @property
    def emulated(self) -> bool:
        return self.hosts > 1


DEFAULT_HOSTS = Hosts(2, 2)  # the multi-host mode's cluster: 2 hosts x 2 ranks, 2 Gbit/s links, 0.1 ms


def turns(configs: Sequence[str], rounds: int) -> Iterator[str]:
    """``configs`` taking turns for ``rounds`` rounds, each round in a new order (seeded: the same on every rank), so
    each configuration follows each other about as often (a rotation of one order keeps its predecessor the same)."""
    order = random.Random(0)
    for _ in range(rounds):
        yield from order.sample(list(configs), len(configs))


# glibc malloc that keeps freed memory: a fixed mmap threshold (32 MiB, glibc's most) and no trimming of the heap. With
# glibc's defaults, a TorchRec DLRM-v2 step on this VM took 2,000-3,000 page faults (fresh pages of freed and
# re-allocated buffers; embshard's took 0-50) and 17-23% longer; with these settings neither takes any. Both runtimes of
# a benchmark share its processes, so both get the same allocator.
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"


def add_malloc_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--malloc", choices=("kept", "default"), default="kept",
                        help="the ranks' glibc malloc: kept (freed memory kept, no page faults from re-allocation; "
                             "the default) or glibc's default settings")


def malloc_env(choice: str) -> dict[str, str]:
    """The ranks' environment for ``--malloc``."""
    return {"GLIBC_TUNABLES": MALLOC_TUNABLES} if choice == "kept" else {}


def malloc_sentence(choice: str) -> str:
    return (f"glibc malloc keeping freed memory (GLIBC_TUNABLES={MALLOC_TUNABLES}: no page faults from re-allocation; "
            "`--malloc default`: glibc's defaults)" if choice == "kept" else "glibc malloc at its default settings")


def add_hosts_arguments(parser: argparse.ArgumentParser) -> None:
    """The multi-host flags: --hosts H --ranks-per-host L --link-gbit G --delay-ms D (read back by `hosts_of`)."""
    group = parser.add_argument_group("multi-host mode (emulated hosts: network namespaces joined by shaped links; needs root)")
    group.add_argument("--hosts", type=int, help="emulated hosts, at least 2 (default: one host, no emulation)")
    group.add_argument("--ranks-per-host", type=int, help=f"ranks on each emulated host (default {DEFAULT_HOSTS.ranks_per_host})")
    group.add_argument("--link-gbit", type=float, help=f"each host link's rate, each way (default {DEFAULT_HOSTS.link_gbit:g})")
    group.add_argument("--delay-ms", type=float, help=f"each host link's one-way delay, needs netem (default {DEFAULT_HOSTS.delay_ms:g})")


def hosts_of(args: argparse.Namespace, local_ranks: int) -> Hosts:
    """The flags of `add_hosts_arguments` as a `Hosts` (no --hosts: one host of ``local_ranks`` ranks);
    ValueError, saying which flag and how to fix it, on bad input."""
    given = [f"--{k.replace('_', '-')}" for k in ("ranks_per_host", "link_gbit", "delay_ms") if getattr(args, k) is not None]
    if args.hosts is None:
        if given:
            raise ValueError(f"{', '.join(given)} without --hosts: add --hosts 2 (or more) for emulated hosts, "
                             "or leave them out for one host")
        return Hosts(1, local_ranks)
    if args.hosts < 2:
        raise ValueError(f"--hosts {args.hosts}: the multi-host mode needs at least 2 emulated hosts; "
                         "leave out --hosts (and the other host flags) for one host")
    hosts = Hosts(args.hosts, *(getattr(args, k) if getattr(args, k) is not None else getattr(DEFAULT_HOSTS, k)
                                for k in ("ranks_per_host", "link_gbit", "delay_ms")))
    for flag, value, ok, need in (("--ranks-per-host", hosts.ranks_per_host, hosts.ranks_per_host >= 1, "at least 1"),
                                  ("--link-gbit", hosts.link_gbit, hosts.link_gbit > 0, "a rate above 0"),
                                  ("--delay-ms", hosts.delay_ms, hosts.delay_ms >= 0, "0 or more")):
        if not ok:
            raise ValueError(f"{flag} {value:g}: give {need}")
    return hosts


def run_ranks(script: str, args: Sequence[str], *, hosts: int, ranks_per_host: int, link_gbit: float = 2.0,
              delay_ms: float = 0.1, env: Mapping[str, str] | None = None, timeout_s: float | None = None,
              cpu_per_rank: float | None = None) -> str:
    """`python script *args` on hosts x ranks_per_host ranks, each with torchrun's variables (`init_rank` joins
    them): hosts=1 on this host, else on emulated hosts with torchrun per host (`run_torchrun`), links shaped to
    link_gbit and delay_ms, each rank capped at cpu_per_rank of a core if given. Returns how the inter-host links
    were shaped (and the caps; "" on one host); RuntimeError if any rank fails, with the hosts' log tails;
    EmulationUnavailable if the hosts cannot be emulated here (not root)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    if hosts == 1:
        port, world = free_port(), ranks_per_host
        procs = [subprocess.Popen([sys.executable, script, *args], env={
            **env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in range(world)]
        _wait(script, procs, timeout_s)
        return ""
    from embshard.emulated_hosts import run_torchrun

    logs = Path(tempfile.mkdtemp(prefix="embshard-bench-hosts-"))
    exits, _, shaping = run_torchrun(hosts, ranks_per_host, [script, *args], timeout_s or 10 ** 6, link_gbit, delay_ms, logs, env,
                                     cpu_per_rank)
    if any(e.returncode != 0 for e in exits):
        tails = "\n".join(f"--- host {e.host} (exit {e.returncode}):\n{e.log.read_text()[-3000:]}" for e in exits)
        raise RuntimeError(f"{script}: a host failed, exits {[e.returncode for e in exits]}\n{tails}")
    return shaping


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
