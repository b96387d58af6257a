"""Counted = predicted bytes on 2 hosts x 3 ranks (localhost, gloo): the traffic cases of
rt_traffic.py in a group of 6 (the other world sizes run them in test_runtime.py)."""

from __future__ import annotations


from rt_harness import run_group
from rt_traffic import FIELDS

GROUP_TIMEOUT_S = 240


def test_counted_bytes_equal_the_cost_model_on_2_hosts_x_3_ranks() -> None:
    results = run_group(6, GROUP_TIMEOUT_S, only="traffic-")
    for rank, cases in enumerate(results):
        assert cases and "__exit__" not in cases, f"rank {rank}: {cases.get('__exit__', {}).get('error', 'no results')}"
        for name, result in cases.items():
            assert "error" not in result, f"rank {rank} {name}: {result['error']}"
            counted = {f: result[f"counted_{f}"] for f in FIELDS}
            predicted = {f: result[f"predicted_{f}"] for f in FIELDS}
            assert counted == predicted, f"rank {rank} {name}: counted {counted} != predicted {predicted}"
            assert counted["inter_host_sent"] > 0 and counted["intra_host_sent"] > 0, f"rank {rank} {name}: {counted}"
        assert len(cases) == 4, sorted(cases)
