"""Where measurements run (cpu or cuda), which backend connects the ranks, and how a rank's time is read.

    from embshard.calibrate.device import resolve_device, backend_of, clock_reader
    device = resolve_device("auto")      # "cuda" if torch sees a GPU, else "cpu"
    read = clock_reader(device)
    rank_s, wall_s = read()

On cpu, ranks talk over gloo and a rank's time is the CPU time of its process (user +
system, gloo's threads included): its work on a core of its own. On cuda, ranks talk over
nccl, one GPU each, and kernels run asynchronously: CPU time would count only the launches,
so a rank's time is wall-clock time read after ``torch.cuda.synchronize()``.
"""

from __future__ import annotations

import time
from typing import Callable

DEVICES = ("cpu", "cuda", "auto")
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def resolve_device(requested: object, where: str = "device", fix: str | None = None) -> str:
    """"cpu" or "cuda" for a requested cpu | cuda | auto; ValueError if cuda is asked of a machine without one
    (``fix``: how to fix it, default: choose cpu or auto)."""
    if requested not in DEVICES:
        raise ValueError(f"{where}: must be one of {list(DEVICES)}, got {requested!r}")
    import torch

    available = torch.cuda.is_available()
    if requested == "auto":
        return "cuda" if available else "cpu"
    if requested == "cuda" and not available:
        why = "torch is built without CUDA" if torch.version.cuda is None else "torch sees no GPU"
        raise ValueError(f"{where}=cuda: no CUDA device on this machine ({why}, torch {torch.__version__}); "
                         + (fix or f"use {where}=cpu, or {where}=auto to take a GPU only where there is one"))
    return requested


def backend_of(device: str) -> str:
    assert device in BACKENDS, device
    return BACKENDS[device]


def local_ranks_available(device: str, world_size: int) -> bool:
    """Whether world_size local ranks can run: any number on cpu, one GPU each on cuda (nccl refuses two ranks on one GPU)."""
    if device == "cpu":
        return True
    import torch

    return torch.cuda.device_count() >= world_size


def clock_reader(device: str) -> Callable[[], tuple[float, float]]:
    """A function returning (rank seconds, wall seconds): CPU time and wall time on cpu; on cuda both are
    the wall time after the GPU finished the work queued so far."""
    assert device in BACKENDS, device
    if device == "cpu":
        return lambda: (time.process_time(), time.perf_counter())
    import torch

    def read() -> tuple[float, float]:
        torch.cuda.synchronize()
        now = time.perf_counter()
        return now, now

    return read
