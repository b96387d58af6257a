"""The pipelined training step (``pipeline=true``, runtime/pipeline.py) on real gloo ranks (pipe_worker.py):
on 2 and on 3 ranks it gives the plain step's losses, eval AUCs and final tables exactly, while every
input dist of a training step ran on the side thread. The two groups run at the same time (on 2 cores about
25 s, where one after the other took 40 s)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest
import torch

from embshard.launch.distributed import RankContext
from embshard.train.checkpoint import read_tables
from embshard.train.trainer import pipelined
from pipe_worker import STEPS
from test_checkpoint_ranks import run_group

WORKER = Path(__file__).resolve().parent / "pipe_worker.py"
WORLD_SIZES = (2, 3)


@pytest.fixture(scope="module")
def groups(request, config_dir, tmp_path_factory) -> Iterator[dict[int, Future]]:
    """world size -> every rank's result (`run_group`), the selected world sizes' groups started at once."""
    wanted = sorted({item.callspec.params["world_size"] for item in request.session.items
                     if getattr(item, "function", None) is test_pipelined_step_trains_exactly_like_the_plain_one})
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        yield {w: pool.submit(run_group, "pipe", w, config_dir, tmp_path_factory.mktemp(f"pipe{w}"), WORKER)
               for w in wanted}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_pipelined_step_trains_exactly_like_the_plain_one(groups, world_size) -> None:
    ranks = groups[world_size].result()
    plain, pipelined = ranks[0]["plain"], ranks[0]["pipelined"]
    assert len(plain["losses"]) == STEPS and plain["auc"], plain
    assert pipelined["losses"] == plain["losses"] and pipelined["auc"] == plain["auc"]
    want, got = read_tables(Path(plain["checkpoint"])), read_tables(Path(pipelined["checkpoint"]))
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    for rank in ranks:
        assert set(rank["plain"]["threads"]) == {"MainThread"}
        side = [t for t in rank["pipelined"]["threads"] if t.startswith("embshard-input-dist")]
        # one input dist per collection (pooled, sequence) and step, plus the replicas' when they look up the
        # global batch; without a pipeline as many, all on the main thread
        assert len(side) == len(rank["pipelined"]["threads"]) == len(rank["plain"]["threads"]), rank["pipelined"]


@pytest.mark.parametrize("setting, world, local_world, want", [
    (None, 4, 2, True), (None, 4, 4, False), (None, 1, 1, False), (True, 2, 2, True), (False, 4, 2, False)])
def test_pipeline_null_means_on_when_the_ranks_span_hosts(setting, world, local_world, want) -> None:
    ctx = RankContext(rank=0, world_size=world, local_rank=0, local_world_size=local_world,
                      device=torch.device("cpu"), pg=None)
    assert pipelined(setting, ctx) is want
