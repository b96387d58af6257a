"""One error line per failed job, not one per rank: the first rank to fail reports, the others stay silent.

An error that every rank raises (a bad batch, unreadable data, a bad serving artifact) and the
"lost contact" errors of the ranks left waiting for a failed peer would otherwise print once per
rank. The first rank to fail claims the report in the job's store (``compare_set``, first writer
wins) and prints; the others see the claim and exit silently, with the reporter's status
(`exit_failed`; embshard-train and embshard-serve ranks end this way). Under torchrun the store
lives in torchrun's agent; under the local launcher rank 0 hosts it, so a failing rank 0 keeps it
up (the process group already closed) until every rank has looked, at most ``STORE_LINGER_S``.
"""

from __future__ import annotations

import time
from typing import Callable, NoReturn

import torch.distributed as dist

from embshard.launch import distributed
from embshard.launch.distributed import RankContext

CLAIM, SEEN = "embshard/error/claim", "embshard/error/seen"
STORE_LINGER_S = 10.0


def _store(ctx: RankContext | None) -> dist.Store | None:
    if ctx is None or ctx.pg is None or ctx.world_size == 1 or not dist.is_initialized():
        return None
    return dist.distributed_c10d._get_default_store()


def claim(ctx: RankContext | None, code: int, lost_group: bool) -> tuple[bool, int]:
    """(whether this rank reports its failure, the job's exit status). The first rank to fail reports, and its
    status (2: bad input, 1: a failure) becomes every rank's, whichever exits first. ``lost_group``: the failure
    is a peer's loss, not reported when the store is gone too (its host, rank 0, failed and reported)."""
    store = _store(ctx)
    if store is None:
        return True, code
    mine = f"{ctx.rank} {code}"
    try:
        first = store.compare_set(CLAIM, "", mine).decode()
        store.add(SEEN, 1)
    except (dist.DistError, RuntimeError):  # the store's host is gone
        return not lost_group, code
    return first == mine, int(first.split()[1])


def exit_failed(ctx: RankContext | None, message: str, code: int, lost_group: bool, fail: Callable[[str, int], NoReturn],
                linger: bool = True) -> NoReturn:
    """End a rank that failed: the first rank to fail prints ``message`` (``fail(message, code)``), the others exit
    silently; each with the first's status, after leaving the group (`stop_after_failure`)."""
    try:
        first, code = claim(ctx, code, lost_group)
        if first:
            fail(message, code)
        raise SystemExit(code)
    finally:
        stop_after_failure(ctx, linger)


def rank_prefix(ctx: RankContext | None) -> str:
    """The "rank R: " that begins a message only this rank found (nothing in a one-rank job)."""
    return f"rank {ctx.rank}: " if ctx is not None and ctx.world_size > 1 else ""


def stop_after_failure(ctx: RankContext | None, linger: bool = True) -> None:
    """Leave the process group; rank 0 keeps the store up until every rank has claimed or looked (unless not
    ``linger``: no other rank will, as they have stopped or lost contact)."""
    store = _store(ctx)
    if ctx is not None:
        distributed.stop(ctx)
    if store is None or ctx.rank != 0 or not linger:
        return
    deadline = time.monotonic() + STORE_LINGER_S
    try:
        while store.add(SEEN, 0) < ctx.world_size and time.monotonic() < deadline:
            time.sleep(0.05)
    except (dist.DistError, RuntimeError):
        pass
