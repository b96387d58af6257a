"""Collectives between hosts, for `embshard-calibrate` started by torchrun on several hosts
(real ones, or `embshard.emulated_hosts`):

    python -m embshard.emulated_hosts --hosts 2 --ranks-per-host 1 -- -m embshard.calibrate.cli profile=two_hosts

Every rank joins the job's process group; the first rank of each host (LOCAL_RANK 0) runs
the collective microbenchmarks (embshard.calibrate.collectives) in a group of one rank per
host, so all their bytes cross hosts; rank 0 gathers the rows (``local_world_size`` 1) and
goes on to measure its own host like a one-host run, the other ranks exit. The fit then
separates intra-host bandwidth and latency (rank 0's local collectives) from inter-host
ones (these rows; embshard.calibrate.fit.collective_rows).
"""

from __future__ import annotations

import datetime
import os
from typing import Any, Mapping

from embshard.cli import RANK_ENV

TORCHRUN_ENV = (*RANK_ENV, "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                "ROLE_NAME")


def measure_across_hosts(cfg: Mapping[str, Any], device: str, log=print) -> list[dict[str, Any]] | None:
    """Collective rows between the torchrun job's hosts on rank 0, None on the other ranks ([] on one host)."""
    import torch.distributed as dist

    from embshard.calibrate.collectives import bench_in_rank
    from embshard.calibrate.device import backend_of

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", rank)), int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if world % local_world:
        raise ValueError(f"torchrun started {world} ranks, {local_world} per host: not a whole number of hosts")
    hosts = world // local_world
    if hosts == 1:
        return [] if rank == 0 else None
    if device == "cuda":
        import torch

        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend_of(device), rank=rank, world_size=world, timeout=datetime.timedelta(seconds=cfg["timeout_s"]))
    try:
        group = dist.new_group([h * local_world for h in range(hosts)])
        cc = cfg["collectives"]
        if rank == 0:
            log(f"collectives between hosts: {len(cc['sizes_bytes'])} sizes on {hosts} hosts (one rank each)")
        rows = None
        if local_rank == 0:
            rows = bench_in_rank(group, {"sizes_bytes": cc["sizes_bytes"], "reps": cc["reps"], "warmup": cc["warmup"],
                                         "device": device})["rows"]
        gathered: list = [None] * world if rank == 0 else None
        dist.gather_object(rows, gathered, dst=0)
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    # rank 0 now measures its host alone: the ranks it spawns must not join the torchrun job (nor, with
    # TORCHELASTIC_USE_AGENT_STORE, look for torchrun's store at their own init address)
    for key in [k for k in os.environ if k in TORCHRUN_ENV or k.startswith("TORCHELASTIC_")]:
        del os.environ[key]
    return [{**row, "local_world_size": 1, "rank": r // local_world} for r, got in enumerate(gathered) if got for row in got]
