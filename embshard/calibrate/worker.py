"""One local rank of a measurement job (spawned by embshard.calibrate.measure.run_ranks):
gloo on CPU, or nccl on GPU ``RANK`` for a job with ``"device": "cuda"``.

    python -m embshard.calibrate.worker JOB.json RANK WORLD_SIZE PORT OUT.json

Job kinds: "plans" (run_plan_in_rank for each plan) and "collectives" (collectives.bench_in_rank).
"""

from __future__ import annotations

import datetime
import gc
import json
import sys
from pathlib import Path

from embshard.fsutil import write_text_atomic

COLLECTIVE_TIMEOUT_S = 300


def main(argv: list[str]) -> None:
    job_path, rank, world_size, port, out = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), argv[4]
    import torch
    import torch.distributed as dist

    from embshard.calibrate.device import backend_of

    job = json.loads(Path(job_path).read_text())
    device = job.get("device", "cpu")
    torch.set_num_threads(1)
    if device == "cuda":
        torch.cuda.set_device(rank)  # local ranks: one GPU each
    dist.init_process_group(backend_of(device), init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    pg = dist.group.WORLD
    if job["kind"] == "plans":
        from embshard.calibrate.measure import run_plan_in_rank
        from embshard.planner.plan import ShardingPlan

        results = []
        for raw in job["plans"]:
            plan = ShardingPlan.from_dict(raw)
            results.append(run_plan_in_rank(plan, pg, job["steps"], job["warmup"], job.get("seed", 0), device=device))
            gc.collect()
        result = {"plans": results}
    elif job["kind"] == "collectives":
        from embshard.calibrate.collectives import bench_in_rank

        result = bench_in_rank(pg, job)
    else:
        raise ValueError(f"unknown job kind {job['kind']!r}")
    write_text_atomic(Path(out), json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
