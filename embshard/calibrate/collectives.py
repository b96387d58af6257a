"""Microbenchmarks of the collectives the runtime uses: all-to-all (even splits) and
all-reduce of fp32 tensors, across message sizes and world sizes, on local ranks: gloo on
CPU, or nccl with the tensors on each rank's GPU (device="cuda"). Through the runtime's own calls
(`embshard.runtime.comm`), so on the runtime's transport: local gloo ranks (``same_host``) through shared
memory, as the runtime's collections run them on one host.

Each rank reports the median CPU time (its process, gloo's threads included; on cuda the
wall time after synchronizing, see embshard.calibrate.device) and wall time of ``reps``
calls after ``warmup``; ranks line up with a barrier before every call.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

OPS = ("all_to_all", "all_reduce")


def bench_in_rank(pg, job: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from embshard.calibrate.device import clock_reader
    from embshard.runtime.comm import all_reduce, all_to_all, use_shared_memory

    device = job.get("device", "cpu")
    where = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    read = clock_reader(device)
    W = dist.get_world_size(pg)
    use_shared_memory(pg, job.get("same_host", False))
    rows = []
    for nbytes in job["sizes_bytes"]:
        n = max(W, int(nbytes) // 4 // W * W)
        x = torch.rand(n, device=where)
        for op in OPS:
            cpu, wall = [], []
            for i in range(job["warmup"] + job["reps"]):
                dist.barrier(group=pg)
                c0, w0 = read()
                if op == "all_to_all":
                    all_to_all(x, [n // W] * W, [n // W] * W, pg)
                else:
                    all_reduce(x, pg)
                c1, w1 = read()
                if i >= job["warmup"]:
                    cpu.append(c1 - c0)
                    wall.append(w1 - w0)
            rows.append({"op": op, "world_size": W, "bytes": n * 4, "cpu_ms": statistics.median(cpu) * 1e3,
                         "wall_ms": statistics.median(wall) * 1e3})
    return {"rows": rows}


def run(world_sizes: Sequence[int], sizes_bytes: Sequence[int], reps: int = 7, warmup: int = 2,
        timeout_s: float = 900.0, device: str = "cpu") -> list[dict[str, Any]]:
    """Rows (op, world_size, bytes per rank, rank, cpu_ms, wall_ms) for every rank of every world size."""
    from embshard.calibrate.measure import run_ranks

    out = []
    for W in world_sizes:
        job = {"kind": "collectives", "sizes_bytes": list(sizes_bytes), "reps": reps, "warmup": warmup, "device": device,
               "same_host": True}
        for rank, result in enumerate(run_ranks(W, job, timeout_s)):
            out.extend({**row, "rank": rank} for row in result["rows"])
    return out
