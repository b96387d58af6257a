"""The per-step header (embshard.runtime.comm.start_header): every rank's batch size agreed by a 2-element MAX
all-reduce where all are equal, followed by an all-gather where they differ, the all-gather at once after a step
whose sizes differed (on that group), and a 1-element all-reduce for the failure flag alone; a rank that passes an
error makes every rank raise, in each mode. Checks the values and the collectives each header calls, in order.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from embshard.runtime.comm import start_header
from rt_local_only import recording_calls


def _agree(value: int | None, error: str | None, pg: dist.ProcessGroup) -> tuple[tuple[int, ...] | None, list[str], str]:
    """(agreed values, collectives called, the ValueError's message or "")."""
    with recording_calls() as names:
        try:
            return start_header(value, error, pg, torch.device("cpu")).result(), names, ""
        except ValueError as e:
            return None, names, str(e)


def header_modes(pg: dist.ProcessGroup) -> dict:
    W, rank = dist.get_world_size(pg), dist.get_rank(pg)
    pg = dist.new_group(list(range(W)))  # a group of its own: no sizes agreed on it before
    reduce, gather = ["all_reduce"], ["all_gather_into_tensor"]
    differ = tuple(3 + 2 * r for r in range(W))
    steps: list[tuple[int | None, str | None, tuple[int, ...] | None, list[str], list[str]]] = [
        # (this rank's value, its error, expected values, expected calls, words the error must hold)
        (5, None, (5,) * W, reduce, []),
        (5, None, (5,) * W, reduce, []),
        (differ[rank], None, differ, reduce + gather, []),  # max != min: the all-gather follows
        (differ[rank], None, differ, gather, []),  # they differed last time: at once
        (7, None, (7,) * W, gather, []),
        (7, None, (7,) * W, reduce, []),  # equal again: back to the all-reduce
        (None, None, None, reduce, []),  # failure alone
        (7, "bad ids" if rank == W - 1 else None, None, reduce + ["all_gather_object"], [f"rank {W - 1}: bad ids"]),
        (None, "no lengths" if rank == 0 else None, None, reduce + ["all_gather_object"], ["rank 0: no lengths"]),
        (differ[rank], None, differ, reduce + gather, []),
        (4, "empty" if rank == 1 else None, None, gather + ["all_gather_object"], ["rank 1: empty"]),
        (0, None, (0,) * W, gather, []),  # a failed header leaves the mode as it was
        (0, None, (0,) * W, reduce, []),
    ]
    errors: dict[str, float] = {}
    for i, (value, error, expected, calls, words) in enumerate(steps):
        got, names, message = _agree(value, error, pg)
        errors[f"err_step{i}_values"] = float(got != expected)
        errors[f"err_step{i}_calls"] = float(names != calls)
        errors[f"err_step{i}_raised"] = float(bool(words) != bool(message) or any(w not in message for w in words))
    dist.destroy_process_group(pg)
    return errors


def cases(world_size: int) -> dict[str, Callable[[dist.ProcessGroup], dict]]:
    return {"header-modes": header_modes}
