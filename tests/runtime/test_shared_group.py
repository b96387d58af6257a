"""embshard.runtime.shared_group on real gloo ranks (shared_group_worker.py): its sum equals gloo's all-reduce (bit
for bit on 2 ranks, up to the order of the additions on 3) and is the same on every rank, a sum past the slot in
rounds; its all-to-all equals gloo's for any splits and dtype, and so do its reduce-scatter and all-gather; any
other message past the slot runs that call on gloo and grows the file; the file leaves no trace in /dev/shm; a rank that exits fails the others at once, one alive but stuck after the group's timeout; where it cannot run, every rank gets None."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from embshard.ports import free_port
from embshard.procs import wait_all
from embshard.runtime.shared_group import SHM_DIR

WORKER = Path(__file__).resolve().parent / "shared_group_worker.py"
REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 90


def _run(world: int, case: str) -> list[dict]:
    out = Path(tempfile.mkdtemp(prefix="shared-group-"))
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, str(WORKER), "--world-size", str(world), "--rank", str(r), "--port",
                               str(port), "--out", str(out / f"{r}.json"), "--case", case],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    logs, timed_out = wait_all(procs, TIMEOUT_S)
    assert not timed_out, logs
    return [json.loads((out / f"{r}.json").read_text()) if (out / f"{r}.json").exists() else {"log": logs[r]}
            for r in range(world)]


def _leftovers() -> set[str]:
    return {p.name for p in SHM_DIR.glob("embshard-group-*")}


@pytest.mark.parametrize("world", [2, 3])
def test_the_sum_is_gloos_on_every_rank(world) -> None:
    before = _leftovers()
    ranks = _run(world, "sums")
    for rank in ranks:
        assert "bitwise_as_gloo" in rank, rank
        assert rank["same_on_every_rank"]
        assert not set(rank["files"]) - before  # unlinked as soon as every rank had mapped it
        assert rank["slot_bytes"][2] == 4096 and rank["slot_bytes"][3:] == [8192] * 6  # 5000 floats: grown, 3 rounds
        if world == 2:
            assert all(rank["bitwise_as_gloo"]), rank["bitwise_as_gloo"]
    assert _leftovers() == before


@pytest.mark.parametrize("world", [2, 3])
def test_the_all_to_all_is_gloos(world) -> None:
    ranks = _run(world, "a2a")
    for rank in ranks:
        assert rank.get("equal") == [True] * 6, rank
        assert rank["slot_bytes"] > 4096  # a round of up to 300 x 5 floats per receiver did not fit


@pytest.mark.parametrize("world", [2, 3])
def test_reduce_scatter_and_all_gather_are_gloos(world) -> None:
    for rank in _run(world, "scatter_gather"):
        assert rank.get("equal") == [True] * 4, rank
        assert rank["slot_bytes"] > 4096  # 2,000 floats per rank did not fit


def test_a_rank_that_exits_fails_the_others_at_once() -> None:
    ranks = _run(3, "exit")
    for rank in ranks[:2]:
        assert rank["error"] and "rank(s) [2]" in rank["error"] and "exited" in rank["error"], rank
        assert rank["seconds"] < 10


def test_a_rank_alive_but_stuck_fails_the_others_after_the_groups_timeout() -> None:
    ranks = _run(3, "stuck")
    for rank in ranks[:2]:
        assert rank["error"] and "rank(s) [2]" in rank["error"] and "did not arrive in 3 s" in rank["error"], rank
        assert rank["wait_s"] == 3 and 3 <= rank["seconds"] < 10, rank
    assert ranks[2] == {"error": None}


def test_none_on_every_rank_where_it_cannot_run() -> None:
    before = _leftovers()
    assert _run(2, "refused") == [{"other_hosts": True, "too_large": True}] * 2
    assert _leftovers() == before
