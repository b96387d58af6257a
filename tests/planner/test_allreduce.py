"""The data-parallel all-reduce the runtime runs: hierarchical where ranks span hosts and it pays,
priced per link class (embshard.planner.cost.allreduce) and counted so (traffic.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from embshard.planner import evaluate, manual_plan
from embshard.planner.cost.allreduce import (collective_fixed_ms, flat_allreduce_ms, hierarchical_allreduce, hierarchical_allreduce_ms,
                                             runtime_allreduce_ms)
from embshard.specs import TableSpec
from embshard.topology import Topology

MB = 1e6


def test_hierarchical_where_ranks_span_hosts_and_it_pays():
    two_hosts = Topology(world_size=16, local_world_size=8, intra_host_gb_per_s=100.0, inter_host_gb_per_s=10.0)
    # ring: 2 x 15/16 of 100 MB through one NIC per host at 10 GB/s; hierarchical: 2 x 7/8 in the host at
    # 100 GB/s (twice: reduce-scatter, all-gather; full duplex) and 2 x 1/2 x 1/8 of it across at 10 GB/s
    assert flat_allreduce_ms(100 * MB, two_hosts) == pytest.approx(2 * 100 * 15 / 16 / 10)
    assert hierarchical_allreduce_ms(100 * MB, two_hosts) == pytest.approx(2 * 100 * 7 / 8 / 100 + 2 * 100 / 2 / 8 / 10)
    assert hierarchical_allreduce(100 * MB, two_hosts)
    assert runtime_allreduce_ms(100 * MB, two_hosts) == hierarchical_allreduce_ms(100 * MB, two_hosts)
    # the ring's legs inside a host cost as much as the reduce-scatter's, and its 2(W-1) fixed steps more than
    # the hierarchy's 2(L-1) + 2(H-1): it pays even with slow in-host links and tiny buffers; off, one host, one
    # rank per host: the ring
    slow_in_host = replace(two_hosts, intra_host_gb_per_s=1.0, collective_ms=0.01, inter_host_collective_ms=0.05)
    assert hierarchical_allreduce(100, slow_in_host) and hierarchical_allreduce(100 * MB, slow_in_host)
    assert runtime_allreduce_ms(100, slow_in_host) == pytest.approx(2 * 7 * 0.01 + 2 * 0.06 + 2 * 100 * 7 / 8 / 1e6, rel=1e-3)
    # its own copies (3 x the buffer at the calibrated per-byte cost) can outweigh what it saves across hosts
    gloo = Topology(world_size=4, local_world_size=2, device="cpu", full_duplex=False, intra_host_gb_per_s=2.7,
                    inter_host_gb_per_s=0.5)
    assert hierarchical_allreduce(10 * MB, gloo) and not hierarchical_allreduce(10 * MB, replace(gloo, dist_ns_per_byte=1.0))
    assert runtime_allreduce_ms(10 * MB, replace(gloo, dist_ns_per_byte=0.1)) == pytest.approx(
        hierarchical_allreduce_ms(10 * MB, gloo) + 3 * 10 * MB * 0.1e-6)
    for topo in (replace(two_hosts, reduce_in_host=False), replace(two_hosts, local_world_size=16),
                 replace(two_hosts, local_world_size=1)):
        assert not hierarchical_allreduce(100 * MB, topo)
        assert runtime_allreduce_ms(100 * MB, topo) == flat_allreduce_ms(100 * MB, topo)
    one_host = replace(two_hosts, local_world_size=16)
    assert hierarchical_allreduce_ms(100 * MB, one_host) == pytest.approx(flat_allreduce_ms(100 * MB, one_host))


def test_hierarchical_bytes_cross_hosts_once_per_local_share():
    """2 hosts x 4 ranks, a 1000 x 8 data-parallel table (small: its whole gradient, 8,000 floats, no mask of the rows
    looked up, embshard.runtime.row_union). Hierarchical: each rank sends 3/4 of the buffer inside the host twice
    (reduce-scatter, all-gather) and its 2,000 floats' ring share across (2 x 1,000); the ring sends 2 x 7/8 of it
    from one rank per host."""
    topo = Topology(world_size=8, local_world_size=4, hbm_gib=1, batch_size_per_rank=8)
    specs = [TableSpec("t", 1000, 8, optimizer="sgd")]
    layout = {"t": ("data_parallel", ())}
    tables = [replace(t, data_parallel_mode="allreduce") for t in manual_plan(specs, topo, layout).tables]
    hier = evaluate(specs, topo, tables)
    for t in hier.traffic:
        assert (t.intra_host_sent, t.intra_host_received) == (2 * 6000 * 4, 2 * 6000 * 4)
        assert (t.inter_host_sent, t.inter_host_received) == (2 * 1000 * 4, 2 * 1000 * 4)
    flat = evaluate(specs, replace(topo, reduce_in_host=False), tables)
    assert [t.inter_host_sent for t in flat.traffic] == [0, 0, 0, 2 * 7000 * 4] * 2
    assert sum(t.inter_host_sent for t in flat.traffic) == 1.75 * sum(t.inter_host_sent for t in hier.traffic)


# The cpu_gloo_measured profile on 2 hosts x 2 ranks, inter-host 0.5 GB/s (the schema-9 fixture's topology, as
# benchmarks/plans_multihost.py plans for a 2 Gbit/s link) and the hierarchy's CPU work fitted on top of it
# (embshard.calibrate.fit.dp_hier_fit): 3 data-parallel layouts of 5.4-10.6 MB on 4 local ranks as 2 hosts x 2,
# 2026-12-01, 2-core Xeon under load ~4.9: dp_allreduce per rank 27-39 ms hierarchical against 9-13 ms by the ring at 10.6 MB.
MEASURED_DP_HIER = dict(dp_hier_ns_per_byte=0.431, dp_hier_call_ms=0.652)


def test_measured_cpu_work_of_the_hierarchy_makes_the_ring_the_choice():
    """With the hierarchy's CPU work as measured, one ring is cheaper on 2 hosts x 2 CPU ranks at every size (the
    runtime, which asks the same function, runs it), and the plan's price and predicted bytes follow; without it
    (older profiles) the hierarchy stays the choice."""
    from pathlib import Path

    from embshard.planner.plan import ShardingPlan

    base = ShardingPlan.load(Path(__file__).parent / "data" / "plan_v9.json").topology
    measured = replace(base, **MEASURED_DP_HIER)
    for size in (0.1 * MB, 10 * MB, 100 * MB):
        assert hierarchical_allreduce(size, base) and not hierarchical_allreduce(size, measured)
        assert runtime_allreduce_ms(size, measured) == flat_allreduce_ms(size, measured) + collective_fixed_ms(measured, 2)
    specs = [TableSpec(f"t{i}", 20_000, 64) for i in range(2)]  # about 5 MB of gradients each
    tables = [replace(t, data_parallel_mode="allreduce")
              for t in manual_plan(specs, base, {s.name: ("data_parallel", ()) for s in specs}).tables]
    old, new = evaluate(specs, base, tables), evaluate(specs, measured, tables)
    ring = evaluate(specs, replace(measured, reduce_in_host=False), tables)
    assert [r.perf.dp_allreduce_ms for r in new.ranks] == pytest.approx([r.perf.dp_allreduce_ms for r in ring.ranks], rel=1e-12)
    assert new.traffic == ring.traffic and sum(t.inter_host_sent for t in new.traffic) > sum(t.inter_host_sent for t in old.traffic)


def test_the_inter_host_legs_of_the_all_reduce_are_link_time_that_the_phase_factor_does_not_scale():
    """dp_allreduce_factor (a rank's work, fitted on one host) scales the all-reduce's work inside a host; its legs
    across hosts are link time, as the other phases' (`perf._factored`). A factor of 0.15 once priced 20 MB of
    gradients crossing a 0.25 GB/s link at 12 ms where the link alone takes 82."""
    from embshard.planner.cost.allreduce import flat_allreduce_link_ms, hierarchical_allreduce_link_ms, runtime_allreduce_parts_ms

    two_hosts = Topology(world_size=4, local_world_size=2, intra_host_gb_per_s=3.0, inter_host_gb_per_s=0.25, full_duplex=False)
    # hierarchical: each rank's half of the buffer around the ring of 2 hosts: 2 x 1/2 of it sent and as much
    # received (half duplex: their sum)
    assert hierarchical_allreduce_link_ms(20 * MB, two_hosts) == pytest.approx(2 * (2 * 10 / 2) / 0.25)
    # the ring: the last rank of a host sends 2 x 3/4 of the buffer across, receives it inside the host
    assert flat_allreduce_link_ms(20 * MB, two_hosts) == pytest.approx(2 * 20 * 3 / 4 / 0.25)
    assert flat_allreduce_ms(20 * MB, two_hosts) == pytest.approx(2 * 20 * 3 / 4 / 0.25 + 2 * 20 * 3 / 4 / 3.0)
    one_host = replace(two_hosts, local_world_size=4)
    assert runtime_allreduce_parts_ms(20 * MB, one_host)[1] == 0.0
    assert flat_allreduce_link_ms(20 * MB, replace(two_hosts, local_world_size=1)) == pytest.approx(flat_allreduce_ms(20 * MB, replace(two_hosts, local_world_size=1)))

    specs = [TableSpec("t", 20_000, 64, optimizer="sgd")]  # 5.12 MB of gradients: every row looked up
    for topo in (two_hosts, replace(two_hosts, reduce_in_host=False), one_host):
        topo = replace(topo, batch_size_per_rank=65_536)
        tables = [replace(t, data_parallel_mode="allreduce") for t in manual_plan(specs, topo, {"t": ("data_parallel", ())}).tables]
        whole = evaluate(specs, topo, tables).ranks[0].perf.dp_allreduce_ms
        total, link = runtime_allreduce_parts_ms(20_000 * 64 * 4, topo)
        assert total == runtime_allreduce_ms(20_000 * 64 * 4, topo)
        assert (link > 0) == (topo.num_hosts > 1)
        link += runtime_allreduce_parts_ms(20_000 * 2, topo)[1]  # and the mask of the rows looked up
        scaled = evaluate(specs, replace(topo, dp_allreduce_factor=0.15), tables).ranks[0].perf.dp_allreduce_ms
        assert scaled == pytest.approx(0.15 * (whole - link) + link, rel=1e-12)


def test_across_hosts_the_allreduce_mode_exchanges_the_rows_looked_up():
    """embshard.runtime.row_union: across hosts a table trained by all-reduce sends a mask of its rows (fp16) and the
    gradient of the rows the global batch looks up (uniform ids: the expected distinct rows), or of every row where
    that is half of them or more; adam's rows looked up only, without their counts; a small table (gradient under
    256 KiB) whole. On one host: every row, as DDP."""
    from embshard.planner.cost.traffic import allreduce_exchange_floats, allreduce_rows
    from embshard.planner.cost.units import expected_distinct_rows

    two_hosts = Topology(world_size=4, local_world_size=2, hbm_gib=1, batch_size_per_rank=512)
    one_host = replace(two_hosts, local_world_size=4)
    big, small = TableSpec("big", 100_000, 16), TableSpec("small", 1000, 16)
    hit = expected_distinct_rows(4 * 512, 100_000)
    assert 2000 < hit < 2048 and allreduce_rows(big, two_hosts) == pytest.approx(hit)
    assert allreduce_rows(small, two_hosts) == 1000  # 64 KB of gradient: whole
    assert allreduce_rows(replace(big, num_embeddings=4095), two_hosts) == 4095  # just under 256 KiB
    assert allreduce_rows(replace(big, num_embeddings=4096), two_hosts) < 4096 * 0.5
    assert allreduce_rows(big, one_host) == 100_000
    assert allreduce_rows(big, replace(two_hosts, sharded_dp_update=True)) == 100_000
    adam = replace(small, optimizer="adam")
    assert allreduce_exchange_floats(adam, two_hosts) == pytest.approx(expected_distinct_rows(2048, 1000) * 16)
    assert allreduce_exchange_floats(adam, one_host) == 1000 * 17  # and its id counts
    specs = [big]
    flat = replace(two_hosts, reduce_in_host=False)  # one ring of 4: rank 1 sends across, 2 x 3/4 of each buffer
    tables = [replace(t, data_parallel_mode="allreduce") for t in manual_plan(specs, flat, {"big": ("data_parallel", ())}).tables]
    sent = [t.inter_host_sent for t in evaluate(specs, flat, tables).traffic]
    grad_floats = round(hit * 16)
    assert sent[1] == pytest.approx(2 * 3 / 4 * (grad_floats * 4 + 100_000 * 2), rel=1e-3) and sent[0] == 0
    ms = {t: evaluate(specs, t, [replace(x, data_parallel_mode="allreduce") for x in
                                 manual_plan(specs, t, {"big": ("data_parallel", ())}).tables]).ranks[0].perf.dp_allreduce_ms
          for t in (flat, replace(flat, local_world_size=4))}
    assert ms[flat] < ms[replace(flat, local_world_size=4)]  # 3% of the rows (and a mask) cross the link, not all
