"""Multi-process gloo tests of the sharded runtime against unsharded TorchRec references.

One real process group per world size (2, 3, 4) runs every case (tests/runtime/rt_*.py)
and reports its numbers; each test below checks one case on every rank. A failing rank
cannot hang the suite: collectives time out after 60 s and the group is killed after
GROUP_TIMEOUT_S.
"""

from __future__ import annotations

import functools

import pytest

from rt_harness import run_group
from rt_worker import all_case_functions

WORLD_SIZES = (2, 3, 4)
GROUP_TIMEOUT_S = 480
FP32_TOL = 1e-5


@functools.lru_cache(maxsize=None)
def group_results(world_size: int) -> list[dict]:
    return run_group(world_size, GROUP_TIMEOUT_S)


CASES = [(w, name) for w in WORLD_SIZES for name in all_case_functions(w)]


@pytest.mark.parametrize("world_size,case", CASES, ids=[f"w{w}-{n}" for w, n in CASES])
def test_case(world_size: int, case: str) -> None:
    for rank, results in enumerate(group_results(world_size)):
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
