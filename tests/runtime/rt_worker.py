"""One rank of a spawned gloo group: runs every case for its world size, writes results as JSON.

    python tests/runtime/rt_worker.py --world-size 2 --rank 0 --port 29500 --out /tmp/r0.json [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import rt_bad_input  # noqa: E402
import rt_header  # noqa: E402
import rt_hot_rows  # noqa: E402
import rt_inference  # noqa: E402
import rt_local_only  # noqa: E402
import rt_model  # noqa: E402
import rt_row_union  # noqa: E402
import rt_sharded_update  # noqa: E402
import rt_traffic  # noqa: E402
import rt_training  # noqa: E402
import rt_transport  # noqa: E402

COLLECTIVE_TIMEOUT_S = 60


def all_case_functions(world_size: int) -> dict:
    return {**rt_training.training_cases(world_size), **rt_bad_input.cases(world_size), **rt_header.cases(world_size), **rt_model.cases(world_size),
            **rt_inference.cases(world_size), **rt_traffic.cases(world_size), **rt_hot_rows.cases(world_size),
            **rt_sharded_update.cases(world_size), **rt_local_only.cases(world_size),
            **rt_transport.cases(world_size), **rt_row_union.cases(world_size)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world_size, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    pg = dist.group.WORLD
    all_cases = all_case_functions(args.world_size)
    results: dict[str, dict] = {}
    for name, fn in all_cases.items():
        if args.only and args.only not in name:
            continue
        try:
            results[name] = fn(pg)
        except Exception as e:  # reported to pytest, which fails the case
            results[name] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
        tmp = args.out + ".tmp"
        Path(tmp).write_text(json.dumps(results))
        os.replace(tmp, args.out)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # skip the interpreter's teardown: a gloo worker thread still holding a finished work's tensors can abort
    # it ("terminate called without an active exception", SIGABRT) after the rank has done and said all
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(0)
