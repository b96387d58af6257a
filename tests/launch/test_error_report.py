"""report.claim: of the ranks that fail, the first reports and the others take its exit status (in-process,
on a HashStore standing for the job's store; the 2-rank runs are in test_training_runs.py)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from embshard.launch import report
from embshard.launch.distributed import RankContext


def ctx(rank: int) -> RankContext:
    return RankContext(rank, 3, rank, 3, torch.device("cpu"), pg=None)


def test_the_first_rank_to_fail_reports_and_sets_the_status(monkeypatch) -> None:
    store = dist.HashStore()
    monkeypatch.setattr(report, "_store", lambda c: store)
    assert report.claim(ctx(2), 2, lost_group=False) == (True, 2)  # rank 2: bad input
    assert report.claim(ctx(0), 1, lost_group=True) == (False, 2)  # rank 0 lost rank 2: silent, rank 2's status
    assert report.claim(ctx(1), 2, lost_group=False) == (False, 2)  # the same error, later: silent
    assert store.add(report.SEEN, 0) == 3


class GoneStore:
    def compare_set(self, *args):
        raise dist.DistNetworkError("Connection was likely closed")


@pytest.mark.parametrize("lost_group,reports", [(True, False), (False, True)])
def test_without_the_store_only_own_errors_are_reported(monkeypatch, lost_group: bool, reports: bool) -> None:
    monkeypatch.setattr(report, "_store", lambda c: GoneStore())  # its host, rank 0, is gone (and reported)
    assert report.claim(ctx(1), 1, lost_group) == (reports, 1)
