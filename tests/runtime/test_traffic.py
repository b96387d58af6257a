"""Counted = predicted bytes: the traffic cases of rt_traffic.py on 2 hosts x 3 ranks
(localhost, gloo; the other world sizes run them in test_runtime.py), and on 2 emulated hosts
x 2 ranks (network namespaces, torchrun; skipped, saying why, where namespaces cannot be made).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from embshard.emulated_hosts import EmulatedHosts, EmulationUnavailable

from rt_harness import run_group
from rt_traffic import FIELDS

GROUP_TIMEOUT_S = 240
EMULATED_TIMEOUT_S = 180
SCRIPT = Path(__file__).with_name("emulated_traffic.py")


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
        assert len(cases) == 7, sorted(cases)  # 4 plans, 2 of them with hot rows, and one with flat collectives


def test_counted_bytes_equal_the_cost_model_on_emulated_hosts(tmp_path) -> None:
    """2 emulated hosts (network namespaces, shaped link) x 2 ranks under torchrun: counted =
    predicted (with hot rows too), and each host's link carried at least the inter-host bytes its ranks counted."""
    try:
        with EmulatedHosts(2, rate_gbit=2.0, delay_ms=0) as cluster:
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OUT": str(tmp_path)}
            procs = cluster.torchrun(2, [str(SCRIPT)], env, tmp_path)
            exits = cluster.wait(procs, EMULATED_TIMEOUT_S)
            links = [cluster.link_bytes(h) for h in range(2)]
    except EmulationUnavailable as e:
        pytest.skip(f"emulated hosts unavailable (needs root and iproute2's ip/tc): {e}")
    logs = [(tmp_path / f"host{h}.log").read_text()[-3000:] for h in range(2)]
    assert [e.returncode for e in exits] == [0, 0], logs
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    for rank, cases in enumerate(results):
        for name, result in cases.items():
            counted = {f: result[f"counted_{f}"] for f in FIELDS}
            assert counted == {f: result[f"predicted_{f}"] for f in FIELDS}, f"rank {rank} {name}"
    for host, link in enumerate(links):
        counted_sent = sum(result["counted_inter_host_sent"] for r in (2 * host, 2 * host + 1) for result in results[r].values())
        assert link.sent_bytes >= counted_sent > 0, (host, link, counted_sent)
