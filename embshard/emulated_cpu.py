"""CPU caps for emulated ranks: each rank of an emulated cluster gets a fixed share of a core, as a rank of a
real cluster has a device of its own.

Without caps, the ranks of emulated hosts share this machine's cores: a rank that waits in a collective
lends its core to the others, so a plan's step takes about the ranks' summed CPU work over the cores, and
a plan that loads one rank more than another costs no more than a balanced one. On a real cluster a rank
that finishes early cannot lend its GPU, and the slowest rank sets the step: what the planner minimises.
`RankCpuCaps` puts each rank process (found by the ``RANK`` that torchrun gives it, beside the run's
``EMBSHARD_EMULATED_RUN`` marker in its environment) into a cgroup of its own whose CPU bandwidth is
``cpu_per_rank`` of one core (CFS quota ``cpu_per_rank`` x ``PERIOD_US`` per period, the period longer where
the quota would be under the kernel's 1 ms; cgroup v1's ``cpu``
controller, or v2's ``cpu.max``), so a rank's work takes its CPU time over ``cpu_per_rank`` whatever the
others do. The cgroups are named ``embshard-PID-N`` (the run's) and removed
with the run; those of runs whose process is gone are removed by the next one. Needs root and a cgroup
CPU controller: elsewhere `RankCpuCaps` raises `CpuCapsUnavailable`.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Iterator

MARKER = "EMBSHARD_EMULATED_RUN"  # in the environment of a run's processes: the run's name
PERIOD_US = 2_000  # the finest whole-ms quota at half a core: a peer that waits on a throttled rank waits at most 1 ms
MIN_QUOTA_US = 1_000  # the kernel's least CFS quota
ROOTS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))  # cgroup v1's cpu controller, or the v2 hierarchy


class CpuCapsUnavailable(RuntimeError):
    """No cgroup CPU controller this process may write to (not root, or none mounted)."""


def _controller_root() -> tuple[Path, bool]:
    """(the cgroup directory new groups go under, whether it is cgroup v2)."""
    for root in ROOTS:
        if (root / "cpu.cfs_quota_us").exists():
            return root, False
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split():
            return root, True
    raise CpuCapsUnavailable("no cgroup CPU controller is mounted (/sys/fs/cgroup/cpu for v1, or cpu in "
                             "/sys/fs/cgroup/cgroup.controllers for v2)")


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (someone else's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        pass
    return True


def check_share(cpu_per_rank: float) -> None:
    """ValueError unless ``cpu_per_rank`` is a share of a core above 0 and at most the machine's cores."""
    if not 0 < cpu_per_rank <= (os.cpu_count() or 1):
        raise ValueError(f"cpu_per_rank={cpu_per_rank:g}: give a share of a core above 0 and at most the machine's "
                         f"{os.cpu_count()} cores, or None for no cap")


def remove_stale(prefix: str) -> list[str]:
    """Remove the rank cgroups of runs whose process is gone (``prefix``PID-N); their names."""
    try:
        root, _ = _controller_root()
    except CpuCapsUnavailable:
        return []
    stale = []
    for group in root.glob(f"{prefix}*"):
        m = re.fullmatch(re.escape(prefix) + r"(\d+)-\d+", group.name)
        if m and group.is_dir() and not pid_alive(int(m.group(1))):
            _remove(group)
            stale.append(group.name)
    return stale


def _remove(group: Path) -> None:
    """rmdir the run's rank groups and the run's group (their processes, if any, move back to the root)."""
    parent = group.parent
    for sub in sorted(group.glob("rank*")):
        if sub.is_dir():
            for pid in (sub / "cgroup.procs").read_text().split():
                try:
                    (parent / "cgroup.procs").write_text(pid)
                except (ProcessLookupError, OSError):
                    pass
            sub.rmdir()
    group.rmdir()


class RankCpuCaps:
    """``cpu_per_rank`` of a core for each of ``world_size`` ranks; `watch` places rank processes as they start."""

    def __init__(self, name: str, world_size: int, cpu_per_rank: float) -> None:
        check_share(cpu_per_rank)
        root, self.v2 = _controller_root()
        self.world_size = world_size
        self.group = root / name
        self.placed: dict[int, int] = {}  # pid -> rank
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        quota_us = max(MIN_QUOTA_US, round(cpu_per_rank * PERIOD_US))
        period_us = round(quota_us / cpu_per_rank)
        try:
            self.group.mkdir()
            if self.v2:
                (self.group / "cgroup.subtree_control").write_text("+cpu")
            for r in range(world_size):
                sub = self.group / f"rank{r}"
                sub.mkdir()
                if self.v2:
                    (sub / "cpu.max").write_text(f"{quota_us} {period_us}")
                else:
                    (sub / "cpu.cfs_period_us").write_text(str(period_us))
                    (sub / "cpu.cfs_quota_us").write_text(str(quota_us))
        except OSError as e:
            self.close()
            raise CpuCapsUnavailable(f"could not create CPU-capped cgroups under {root}: {e}") from e
        self.description = (f"each rank capped at {quota_us / period_us:g} of a core (cgroup CPU quota "
                            f"{quota_us / 1000:g} ms per {period_us / 1000:g} ms)")

    def place(self, pid: int, rank: int) -> bool:
        """Move process ``pid`` (all its threads) into rank ``rank``'s group; False if it is gone."""
        try:
            (self.group / f"rank{rank}" / "cgroup.procs").write_text(str(pid))
        except (ProcessLookupError, OSError):
            return False
        self.placed[pid] = rank
        return True

    def watch(self, interval_s: float = 0.02) -> None:
        """Until every rank is placed (or `close`): place each process started with this run's marker
        (``MARKER=<the group's name>``, which `torchrun` gives every host's environment) and a RANK below the
        world size in its rank's group, soon after it starts; what a placed rank starts later inherits its group."""
        marker = f"{MARKER}={self.group.name}".encode()

        def loop() -> None:
            while len(set(self.placed.values())) < self.world_size and not self._stop.wait(interval_s):
                for pid, rank in _rank_processes(marker):
                    if pid not in self.placed and rank < self.world_size:
                        self.place(pid, rank)
        self._thread = threading.Thread(target=loop, name="embshard-rank-cpu-caps", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop placing and remove the groups (idempotent; call after the ranks have exited)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.group.exists():
            _remove(self.group)


def _rank_processes(marker: bytes) -> Iterator[tuple[int, int]]:
    """(pid, RANK) of each process whose environment holds ``marker`` (``NAME=value``) and a RANK."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes().split(b"\x00")
        except OSError:  # gone, or not ours to read
            continue
        if marker in environ:
            rank = next((v[5:] for v in environ if v.startswith(b"RANK=")), b"")
            if rank.isdigit():
                yield int(entry.name), int(rank)
