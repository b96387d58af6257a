"""The planner's own memory: an estimate of a `plan()` call's peak from tables x ranks, checked
against this machine's available memory before any array is built (a refusal that names the
estimate and the fix, instead of an out-of-memory kill halfway through the search).

The estimate is BASE_BYTES (the interpreter, numpy, scipy, Hydra) plus BYTES_PER_TABLE_RANK per
table and rank: the candidate shards grow with both (a big table is offered row blocks down to
a share of the average rank load, and that average shrinks with the ranks). Fitted above the
peak RSS that benchmarks/planner_scale.py measured for the whole embshard-plan process
(5,000 tables x 1,024 ranks: 635 MiB measured, 896 MiB estimated).
"""

from __future__ import annotations

from pathlib import Path

from embshard.topology import GIB

BASE_BYTES = 256 * 2**20
BYTES_PER_TABLE_RANK = 128
MEMINFO = Path("/proc/meminfo")


class PlannerMemoryError(ValueError):
    """Planning this input would not fit this machine's memory; the message has the estimate and the fix."""


def planner_peak_bytes(num_tables: int, world_size: int) -> int:
    """Estimated peak memory of planning num_tables tables on world_size ranks."""
    return BASE_BYTES + BYTES_PER_TABLE_RANK * num_tables * world_size


def available_bytes() -> int | None:
    """Memory this machine can give a new allocation without swapping (MemAvailable), None if unknown."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def check_planner_memory(num_tables: int, world_size: int) -> None:
    """PlannerMemoryError, with the estimate and a fix, when planning would not fit this machine's memory."""
    need, free = planner_peak_bytes(num_tables, world_size), available_bytes()
    if free is None or need <= free:
        return
    fits = max((free - BASE_BYTES) // (BYTES_PER_TABLE_RANK * num_tables), 0)
    raise PlannerMemoryError(
        f"planning {num_tables} tables on topology.world_size={world_size} needs about {need / GIB:.2f} GiB of this machine's "
        f"memory (estimate: {BASE_BYTES // 2**20} MiB + {BYTES_PER_TABLE_RANK} bytes per table and rank) but {free / GIB:.2f} GiB "
        f"is available; fix: plan on a machine with more free memory, or fewer ranks (at most about {fits} for "
        f"{num_tables} tables here) or fewer tables")
