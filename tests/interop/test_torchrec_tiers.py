"""Tiered plans to TorchRec: FUSED_UVM_CACHING with the planned cache share, FUSED_UVM for host memory."""

from __future__ import annotations

import math

import pytest
from torchrec.distributed.embedding_types import EmbeddingComputeKernel

from embshard.interop.torchrec import from_torchrec_plan, to_torchrec_plan, to_torchrec_topology, torchrec_estimate
from embshard.planner import evaluate, manual_plan
from embshard.planner.plan import TablePlacement
from embshard.planner.types import Location, Shard, ShardingType
from embshard.specs import TableSpec
from embshard.topology import GIB, Topology

TOPO = Topology(world_size=4, local_world_size=4, hbm_gib=4.0, ddr_gib=16.0, ddr_gb_per_s=32.0)
SPECS = (TableSpec("cached", 100_000, 64, pooling_factor=4.0, hot_rows=((0.05, 0.8),)),
         TableSpec("host", 50_000, 32), TableSpec("hbm", 1000, 16))


def _tiered():
    base = manual_plan(SPECS, TOPO, {"cached": ("row_wise", [0, 1, 2, 3]), "host": ("table_wise", [1]),
                                     "hbm": ("table_wise", [2])})
    placements = []
    for t in base.tables:
        if t.name == "cached":  # 5% of each row block in an HBM cache
            t = TablePlacement(t.name, t.sharding_type, t.compute_kernel,
                               tuple(Shard(s.rank, s.row_offset, s.num_rows, 0, s.num_cols, Location.UVM_CACHE,
                                           math.ceil(0.05 * s.num_rows)) for s in t.shards))
        elif t.name == "host":
            t = TablePlacement(t.name, t.sharding_type, t.compute_kernel,
                               tuple(Shard(s.rank, s.row_offset, s.num_rows, 0, s.num_cols, Location.HOST) for s in t.shards))
        placements.append(t)
    return evaluate(SPECS, TOPO, placements)


def test_tiered_shards_export_as_uvm_kernels_with_the_cache_load_factor():
    plan = _tiered()
    tr = to_torchrec_plan(plan, "ebc").plan["ebc"]
    assert tr["cached"].compute_kernel == EmbeddingComputeKernel.FUSED_UVM_CACHING.value
    assert tr["cached"].cache_params.load_factor == pytest.approx(0.05)
    assert tr["host"].compute_kernel == EmbeddingComputeKernel.FUSED_UVM.value and tr["host"].cache_params is None
    assert tr["hbm"].compute_kernel == EmbeddingComputeKernel.FUSED.value and tr["hbm"].cache_params is None
    assert [m.shard_sizes for m in tr["cached"].sharding_spec.shards] == [[25_000, 64]] * 4
    # TorchRec's own cost model takes the layout (it sizes the cache from the load factor) ...
    per_rank = torchrec_estimate(plan)
    assert len(per_rank) == 4 and all(ms > 0 for ms in per_rank)
    # ... and it comes back to the same plan
    back = from_torchrec_plan(to_torchrec_plan(plan, "ebc"), SPECS, TOPO)
    assert back.tables == plan.tables and back.ranks == plan.ranks


def test_host_memory_goes_to_torchrecs_ddr_cap_and_uvm_bandwidth():
    tr = to_torchrec_topology(TOPO)
    assert tr.devices[0].storage.ddr == 16 * GIB and tr.hbm_to_ddr_mem_bw == pytest.approx(32.0 * 1e6)


def test_mixed_locations_in_one_table_do_not_export():
    plan = _tiered()
    t = plan.placement("cached")
    mixed = TablePlacement(t.name, t.sharding_type, t.compute_kernel,
                           (Shard(0, 0, 25_000, 0, 64),) + tuple(t.shards[1:]))
    placements = [mixed if p.name == "cached" else p for p in plan.tables]
    with pytest.raises(ValueError, match=r"table 'cached': its shards are in \['hbm', 'uvm_cache'\].*one compute kernel per table"):
        to_torchrec_plan(evaluate(SPECS, TOPO, placements), "ebc")
