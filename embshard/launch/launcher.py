"""Start N local ranks of a job (``launcher.nproc=N``), or none under torchrun.

The launcher re-runs ``python -m MODULE`` (``embshard.train``, ``embshard.serving.serve_cli``)
with the same overrides once per rank, with torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so a local run and
``torchrun --nproc-per-node N -m MODULE ...`` take the same path. It watches the ranks: when
one fails, the others get until their collective timeout to exit on their own (they report
the lost rank), then are killed. A rank that ends badly is also written down (`exit_reason`)
in the folder named by ``RANK_EXITS_ENV``, where the others can read who it was and how it
ended (`reported_exits`: serving names the dead rank). SIGTERM (like Ctrl-C) is passed on to
the ranks, which get ``EXIT_GRACE_S`` to stop on their own before they are killed; more
signals meanwhile change nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from embshard.fsutil import write_text_atomic
from embshard.ports import free_port
from embshard.topology import Topology

RANK_EXITS_ENV = "EMBSHARD_RANK_EXITS"  # the folder where the local launcher writes how a failed rank ended
EXIT_GRACE_S = 10.0  # beyond the collective timeout, for ranks to print their error and exit


@dataclass(frozen=True)
class LauncherConfig:
    nproc: int = 1  # local ranks to start (ignored under torchrun, which starts them)
    collective_timeout_s: float = 300.0  # a collective waiting longer than this fails the run
    master_addr: str = "127.0.0.1"
    master_port: int = 0  # 0: any free port


def check_ranks(topology: Topology, world_size: int, local_world_size: int) -> None:
    """The topology must describe the ranks that run (checked by the launcher too, before it starts them)."""
    if topology.world_size != world_size or topology.local_world_size != local_world_size:
        raise ValueError(f"topology: world_size={topology.world_size}, local_world_size={topology.local_world_size} but "
                         f"{world_size} rank(s) run, {local_world_size} per host; drop the topology.world_size/"
                         "local_world_size overrides (the world size follows launcher.nproc or torchrun) or start as "
                         "many ranks")


def torchrun_ranks() -> tuple[int, int]:
    """(world size, ranks per host) of the torchrun job this process belongs to."""
    world = int(os.environ["WORLD_SIZE"])
    return world, int(os.environ.get("LOCAL_WORLD_SIZE", world))


class _Terminated(Exception):
    """SIGTERM reached the launcher."""


def _raise_terminated(signum, frame) -> None:
    raise _Terminated


def exit_reason(rank: int, code: int) -> str:
    """How a rank ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        return f"rank {rank} was killed by {signal.Signals(-code).name}"
    return f"rank {rank} exited with status {code}"


def reported_exits(timeout_s: float = 0.0) -> list[str]:
    """The `exit_reason` of every rank the local launcher saw fail, waiting up to ``timeout_s`` for one
    (the launcher looks every 0.1 s); [] under torchrun or a single process."""
    folder = os.environ.get(RANK_EXITS_ENV)
    if not folder:
        return []
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            reasons = [p.read_text() for p in sorted(Path(folder).glob("rank_*"), key=lambda p: int(p.name[5:]))]
        except OSError:  # the launcher is gone (its folder with it)
            return []
        if reasons or time.monotonic() >= deadline:
            return reasons
        time.sleep(0.05)


def launch(config: LauncherConfig, args: list[str], base_env: Mapping[str, str], module: str = "embshard.train",
           prog: str = "embshard-train") -> int:
    """Run ``python -m MODULE ARGS`` as ranks 0..nproc-1 with ``base_env`` and torchrun's
    variables; the exit status of the run (``prog`` names it in messages)."""
    port = config.master_port or free_port()
    procs = []
    exits = Path(tempfile.mkdtemp(prefix="embshard-rank-exits-"))
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        for rank in range(config.nproc):
            env = {**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(config.nproc),
                   "LOCAL_WORLD_SIZE": str(config.nproc), "MASTER_ADDR": config.master_addr, "MASTER_PORT": str(port),
                   RANK_EXITS_ENV: str(exits)}
            procs.append(subprocess.Popen([sys.executable, "-m", module, *args], env=env))
        return _watch(procs, config.collective_timeout_s + EXIT_GRACE_S, prog, exits)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; stopped the ranks", file=sys.stderr)
        _stop(procs, signal.SIGINT)
        return 130
    except _Terminated:
        return 0 if _stop(procs, signal.SIGTERM) else 128 + signal.SIGTERM
    finally:
        if signal.getsignal(signal.SIGTERM) is _raise_terminated:  # not stopping on a signal (see _stop)
            signal.signal(signal.SIGTERM, previous)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(exits, ignore_errors=True)


def _stop(procs: list[subprocess.Popen], signum: int) -> bool:
    """Pass ``signum`` on to the ranks and give them EXIT_GRACE_S to exit; whether all exited with status 0.
    Further SIGTERMs and Ctrl-Cs are ignored from now on, until this process exits (``timeout`` and impatient
    users send more)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signum)
    deadline = time.monotonic() + EXIT_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    return all(p.poll() == 0 for p in procs)


def _watch(procs: list[subprocess.Popen], grace_s: float, prog: str, exits: Path) -> int:
    first_failure: tuple[int, int] | None = None  # (rank, status)
    deadline = None
    reported: set[int] = set()
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and rank not in reported:
                write_text_atomic(exits / f"rank_{rank}", exit_reason(rank, code))
                reported.add(rank)
            if code not in (None, 0) and first_failure is None:
                first_failure, deadline = (rank, code), time.monotonic() + grace_s
        if all(c is not None for c in codes):
            break
        if deadline is not None and time.monotonic() > deadline:
            alive = [r for r, c in enumerate(codes) if c is None]
            print(f"{prog}: error: rank(s) {alive} still running {grace_s:.0f} s after rank {first_failure[0]} "
                  "failed; stopped them", file=sys.stderr)
            break
        time.sleep(0.1)
    if first_failure is None:
        return 0
    rank, code = first_failure
    if code < 0:
        print(f"{prog}: error: {exit_reason(rank, code)}; the run stopped", file=sys.stderr)
        return 1
    return code
