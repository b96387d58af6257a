"""Collectives measured between 2 emulated hosts (one rank each, under torchrun) fit the inter-host link
apart from the host's own: what `embshard-calibrate` does under torchrun on several hosts.

Needs root (network namespaces): elsewhere the test skips and says why.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from embshard.calibrate.calibrate import crossed_hosts, fit_data
from embshard.emulated_hosts import EmulationUnavailable, run_torchrun
from embshard.planner.cost.perf import allreduce_ms, collective_fixed_ms, spread_comm_ms
from embshard.topology import Topology

RATE_GBIT = 0.5
WORKER = Path(__file__).with_name("hosts_rows.py")


def test_two_emulated_hosts_fit_the_slow_link_apart_from_the_host(tmp_path) -> None:
    try:
        exits, _, _ = run_torchrun(2, 1, [str(WORKER), str(tmp_path / "rows.json")], timeout_s=120, rate_gbit=RATE_GBIT,
                                   delay_ms=0, log_dir=tmp_path)
    except EmulationUnavailable as e:
        pytest.skip(f"emulated hosts unavailable (needs root and iproute2's ip/tc): {e}")
    assert [e.returncode for e in exits] == [0, 0], [(tmp_path / f"host{h}.log").read_text()[-2000:] for h in range(2)]
    between = json.loads((tmp_path / "rows.json").read_text())
    assert {(r["world_size"], r["local_world_size"], r["rank"]) for r in between} == {(2, 1, 0), (2, 1, 1)}
    # rank 0's local collectives, as a one-host run measures them (here: exact at 2.5 GB/s and 0.2 ms per peer)
    local = replace(Topology(world_size=2, local_world_size=2, device="cpu"), intra_host_gb_per_s=2.5, collective_ms=0.2,
                    full_duplex=False)
    on_host = [{"op": op, "world_size": 2, "bytes": n, "rank": 0, "wall_ms": 0.0, "cpu_ms": ms(n)}
               for op, ms in (("all_to_all", lambda n: collective_fixed_ms(local) + 2 * spread_comm_ms(n, local)),
                              ("all_reduce", lambda n: collective_fixed_ms(local, 2) + allreduce_ms(n, local)))
               for n in (1000, 1_000_000)]
    data = {"device": "cpu", "collectives": on_host + between}
    got = fit_data(data).topology(local)
    assert crossed_hosts(data) == 2
    # the host's terms are fitted on its own rows, apart from the real (noisy) rows between hosts: exact
    # (one joint fit of both gave 2.45 GB/s for 2.5)
    assert got.intra_host_gb_per_s == pytest.approx(2.5, rel=1e-6) and got.collective_ms == pytest.approx(0.2, rel=1e-6)
    # 0.5 Gbit/s is 0.0625 GB/s each way; the half-duplex model sums a rank's sent and received bytes: ~twice that
    assert 0.03 < got.inter_host_gb_per_s < 0.2, got.inter_host_gb_per_s
    print(f"fitted between 2 emulated hosts at {RATE_GBIT} Gbit/s: inter_host_gb_per_s {got.inter_host_gb_per_s:.4f}, "
          f"inter_host_collective_ms {got.inter_host_collective_ms:.4f}")
