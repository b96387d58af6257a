"""The rank's view of the job: process group, device, and agreement helpers.

Ranks come from torchrun's environment (the local launcher sets the same variables); a
run without it is one rank. The backend follows the topology's device: gloo on CPU, nccl
on CUDA (rank i of a host uses GPU LOCAL_RANK). Collectives time out after
``launcher.collective_timeout_s``, so a lost rank fails the others instead of hanging them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, TypeVar

import torch
import torch.distributed as dist

from embshard.topology import Topology
from embshard.cli import under_torchrun
from embshard.launch.launcher import check_ranks, torchrun_ranks

T = TypeVar("T")


class SharedError(ValueError):
    """Raised on every rank with the same message (rank 0 reports it)."""


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    pg: dist.ProcessGroup | None  # None: the unsharded reference, no process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def start(topology: Topology, timeout_s: float, with_group: bool = True) -> RankContext:
    """Join the job's process group (or form a one-rank group) and pick the device."""
    if under_torchrun():
        rank, (world, local_world) = int(os.environ["RANK"]), torchrun_ranks()
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    else:
        rank, world, local_rank, local_world = 0, 1, 0, 1
    check_ranks(topology, world, local_world)
    if topology.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("topology.device: cuda, but no GPU is visible; use topology=train_cpu")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if not with_group:
        return RankContext(0, 1, 0, 1, device, None)
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if under_torchrun():
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout,
                                device_id=device if device.type == "cuda" else None)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return RankContext(rank, world, local_rank, local_world, device, dist.group.WORLD)


def stop(ctx: RankContext) -> None:
    if ctx.pg is not None and dist.is_initialized():
        dist.destroy_process_group()


def on_main(ctx: RankContext, fn: Callable[[], T]) -> T:
    """``fn()`` on rank 0, its result (or its ValueError, as SharedError) on every rank."""
    if ctx.pg is None or ctx.world_size == 1:
        try:
            return fn()
        except ValueError as e:
            raise SharedError(str(e)) from None
    box: list = [None]
    if ctx.is_main:
        try:
            box[0] = ("ok", fn())
        except ValueError as e:
            box[0] = ("error", str(e))
    dist.broadcast_object_list(box, src=0, group=ctx.pg, device=ctx.device)
    kind, value = box[0]
    if kind == "error":
        raise SharedError(value)
    return value


def agree(ctx: RankContext, fn: Callable[[], T], catch: tuple[type[BaseException], ...] = (ValueError,),
          describe: Callable[[BaseException], str] = str) -> T:
    """``fn()`` on every rank, then a verdict shared by all: if it raised (one of ``catch``) on any
    rank, SharedError on every rank with the lowest such rank's ``describe(error)``."""
    result, error = None, None
    try:
        result = fn()
    except catch as e:
        error = describe(e)
    failed = [e for e in all_gather(ctx, error) if e is not None]
    if failed:
        raise SharedError(failed[0])
    return result


def all_sum(ctx: RankContext, values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device)
    if ctx.pg is not None and ctx.world_size > 1:
        dist.all_reduce(t, group=ctx.pg)
    return t.tolist()


def all_gather(ctx: RankContext, value: T) -> list[T]:
    if ctx.pg is None or ctx.world_size == 1:
        return [value]
    out: list = [None] * ctx.world_size
    dist.all_gather_object(out, value, group=ctx.pg)
    return out


def barrier(ctx: RankContext) -> None:
    if ctx.pg is not None and ctx.world_size > 1:
        dist.barrier(group=ctx.pg)


LOST_GROUP = ("lost contact with the other ranks: one of them failed or was killed (see its output), or the network "
              "broke; the last complete checkpoint is still loadable")


def lost_group(e: BaseException) -> bool:
    """Whether ``e`` is a collective failing because a peer went away or timed out."""
    text = str(e)
    return isinstance(e, dist.DistError) or any(k in text for k in ("gloo", "NCCL", "Connection closed", "Connection reset",
                                                                     "Timed out", "timed out"))
