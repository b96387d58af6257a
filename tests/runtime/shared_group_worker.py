"""One rank of test_shared_group.py: SharedGroup against gloo on the same buffers, written as JSON.

    python shared_group_worker.py --world-size W --rank R --port P --out rank.json --case sums|a2a|scatter_gather|exit|refused
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from embshard.runtime import shared_group
from embshard.runtime.shared_group import SharedGroup

START = 4096  # bytes per slot half: the larger rounds do not fit, so the group falls back to gloo and grows


def _files() -> list[str]:
    return sorted(p.name for p in shared_group.SHM_DIR.glob("embshard-group-*"))


def sums(pg, rank: int, world: int) -> dict:
    """Sums of several sizes (the two halves reused many times; past the slot, it grows to SUM_ROUND_BYTES and runs
    in rounds), each against gloo."""
    shared_group.SUM_ROUND_BYTES = 2 * START
    group = SharedGroup.create(pg, same_host=True, slot_bytes=START)
    assert group is not None
    files, grown = _files(), []
    gen = torch.Generator().manual_seed(rank)
    equal, seen = [], []
    for n in (500, 1, 777, 5000, 4096, 3, 5000, 0, 2500):
        mine = torch.randn(n, generator=gen) * 1e3
        flat, want = mine.clone(), mine.clone()
        group.sum_(flat)
        grown.append(group.slot_bytes)
        dist.all_reduce(want, group=pg)
        equal.append(bool(torch.equal(flat, want)))
        seen.append(flat.tolist())
        if not torch.allclose(flat, want, rtol=1e-5, atol=1e-3):
            raise AssertionError(f"round of {n}: the shared sum differs from gloo's beyond rounding")
    gathered = [None] * world
    dist.all_gather_object(gathered, seen, group=pg)
    return {"bitwise_as_gloo": equal, "same_on_every_rank": all(g == seen for g in gathered), "files": files,
            "slot_bytes": grown}


def a2a(pg, rank: int, world: int) -> dict:
    """Rounds of random splits (zeros among them), of rows of floats and of int64 ids, one past the slot."""
    group = SharedGroup.create(pg, same_host=True, slot_bytes=START)
    gen = torch.Generator().manual_seed(7)  # the same on every rank: each knows every rank's splits
    equal = []
    for i, (cols, dtype, most) in enumerate([(3, torch.float32, 20), (0, torch.int64, 50), (5, torch.float32, 300),
                                             (2, torch.float32, 40), (0, torch.int64, 0), (4, torch.float32, 60)]):
        splits = torch.randint(0, most + 1, (world, world), generator=gen)  # [sender, receiver] rows
        in_splits, out_splits = splits[rank].tolist(), splits[:, rank].tolist()
        shape = (sum(in_splits), cols) if cols else (sum(in_splits),)
        x = (torch.arange(int(torch.tensor(shape).prod())).view(shape) + 1000 * rank + 100000 * i).to(dtype)
        got = group.all_to_all(x, out_splits, in_splits)
        want = x.new_empty((sum(out_splits), *shape[1:]))
        dist.all_to_all_single(want, x, out_splits, in_splits, group=pg)
        equal.append(bool(torch.equal(got, want)) and got.dtype == dtype)
    return {"equal": equal, "slot_bytes": group.slot_bytes}


def scatter_gather(pg, rank: int, world: int) -> dict:
    """Reduce-scatters (fp32 and bf16) and all-gathers of several sizes, one past the slot, each against gloo."""
    group = SharedGroup.create(pg, same_host=True, slot_bytes=START)
    gen = torch.Generator().manual_seed(rank)
    equal = []
    for chunk, dtype in ((100, torch.float32), (7, torch.bfloat16), (2000, torch.float32), (1, torch.float32)):
        x = (torch.randn(world * chunk, generator=gen) * 1e3).to(dtype)
        want = x.new_empty(chunk)
        dist.reduce_scatter_tensor(want, x, group=pg)
        got = group.reduce_scatter(x)
        # bf16 partial sums round at each addition, in another order than gloo's: a few ulps of terms up to ~4e3 (16)
        close = torch.allclose(got.float(), want.float(), rtol=1e-5, atol=48.0 if dtype == torch.bfloat16 else 1e-2)
        gathered, want_gathered = x.new_empty(world * chunk), x.new_empty(world * chunk)
        group.all_gather(gathered, want)
        dist.all_gather_into_tensor(want_gathered, want, group=pg)
        equal.append(bool(close and got.dtype == dtype and torch.equal(gathered, want_gathered)))
    return {"equal": equal, "slot_bytes": group.slot_bytes}


def exits(pg, rank: int, world: int) -> dict:
    """The last rank leaves before its second round: the others must fail fast, naming it."""
    group = SharedGroup.create(pg, same_host=True)
    group.sum_(torch.ones(64))
    if rank == world - 1:
        os._exit(0)
    start = time.monotonic()
    try:
        group.sum_(torch.ones(64))
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - start}
    return {"error": None}


def stuck(pg, rank: int, world: int) -> dict:
    """On a group of a 3 s timeout, the last rank stays alive but skips the second round: the others fail after 3 s."""
    group = SharedGroup.create(dist.new_group(list(range(world)), timeout=timedelta(seconds=3)), same_host=True)
    group.sum_(torch.ones(64))
    if rank == world - 1:
        time.sleep(12)
        return {"error": None}
    start = time.monotonic()
    try:
        group.sum_(torch.ones(64))
    except RuntimeError as e:
        return {"error": str(e), "seconds": time.monotonic() - start, "wait_s": group.wait_s}
    return {"error": None}


def refused(pg, rank: int, world: int) -> dict:
    """None on every rank where the topology says the ranks span hosts, or the file would pass MAX_BYTES."""
    other_hosts = SharedGroup.create(pg, same_host=False)
    shared_group.MAX_BYTES = 1024
    too_large = SharedGroup.create(pg, same_host=True, slot_bytes=1024)
    return {"other_hosts": other_hosts is None, "too_large": too_large is None}


def main() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--world-size", "--rank", "--port"):
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--case", required=True, choices=("sums", "a2a", "scatter_gather", "exit", "stuck", "refused"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                            world_size=args.world_size, timeout=timedelta(seconds=60))
    case = {"sums": sums, "a2a": a2a, "scatter_gather": scatter_gather, "exit": exits, "stuck": stuck, "refused": refused}[args.case]
    args.out.write_text(json.dumps(case(dist.group.WORLD, args.rank, args.world_size)))
    os._exit(0)  # no teardown: a peer of the exit case is gone


if __name__ == "__main__":
    main()
