"""Multi-process gloo tests of the sharded runtime against unsharded TorchRec references.

One real process group per world size (2, 3, 4) runs every case (tests/runtime/rt_*.py)
and reports its numbers; each test below checks one case on every rank. The groups of the
selected tests' world sizes start together (on 2 cores about 70 s for the three, where one
after the other took 105 s). A failing rank cannot hang the suite: collectives time out
after 60 s and a group is killed after GROUP_TIMEOUT_S.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

import pytest

from rt_harness import run_group
from rt_worker import all_case_functions

WORLD_SIZES = (2, 3, 4)
GROUP_TIMEOUT_S = 480
FP32_TOL = 1e-5


CASES = [(w, name) for w in WORLD_SIZES for name in all_case_functions(w)]


@pytest.fixture(scope="module")
def groups(request) -> Iterator[dict[int, Future]]:
    """world size -> its group's results (`run_group`), every selected world size's group started at once."""
    wanted = sorted({item.callspec.params["world_size"] for item in request.session.items
                     if getattr(item, "function", None) is test_case})
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        yield {w: pool.submit(run_group, w, GROUP_TIMEOUT_S) for w in wanted}


@pytest.mark.parametrize("world_size,case", CASES, ids=[f"w{w}-{n}" for w, n in CASES])
def test_case(groups: dict[int, Future], world_size: int, case: str) -> None:
    for rank, results in enumerate(groups[world_size].result()):
        assert case in results, f"rank {rank} did not report {case}: {results.get('__exit__', {}).get('error', '')}"
        result = results[case]
        assert "error" not in result, f"rank {rank}: {result['error']}"
        if "raised" in result:  # bad input: every rank raises a ValueError that names what is wrong
            assert result["raised"], f"rank {rank} did not raise"
            for needle in result["expect"]:
                assert needle in result["message"], f"rank {rank}: {needle!r} not in {result['message']!r}"
            assert result["recovered"], f"rank {rank}: the group did not recover"
            continue
        tolerance = result.get("tolerance", FP32_TOL)  # fp16 cases give their own, quantized comms one per error
        for key, value in result.items():
            if key.startswith("err_"):
                limit = result.get(f"tolerance_{key}", tolerance)
                assert value <= limit, f"rank {rank}: {key} = {value:.3g} > {limit:.3g}"
        assert result.get("moved", 1.0) > 1e-3, f"rank {rank}: nothing changed during training"
        assert result.get("replaced", 1.0) == 1.0, f"rank {rank}: shard_model left an unsharded module"
        assert result.get("rounded", 1.0) > 0, f"rank {rank}: quantized comms, yet the result equals fp32's exactly"
