"""embshard <-> TorchRec conversion: configs, exact shard metadata, round trips, clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torchrec.distributed.planner.constants import HBM_MEM_BW
from torchrec.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_row_wise,
    table_wise,
)
from torchrec.distributed.types import ShardingPlan as TrShardingPlan
from torchrec.modules.embedding_configs import DataType
from torchrec.distributed.fbgemm_qcomm_codec import CommType, get_qcomm_codecs_registry
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from embshard.comms import CommsPrecision
from embshard.interop.torchrec import (
    from_torchrec_plan,
    to_embedding_configs,
    to_torchrec_plan,
    to_torchrec_qcomms,
    to_torchrec_topology,
    torchrec_estimate,
)
from embshard.planner import manual_plan
from embshard.planner.types import Shard
from embshard.specs import TableSpec
from embshard.topology import Topology

TOPO = Topology(world_size=16, local_world_size=8, hbm_gib=4.0)
SPECS = (
    TableSpec("tw", 1000, 64, pooling_factor=3.0),
    TableSpec("rw", 1001, 32, feature_names=("rw_a", "rw_b")),
    TableSpec("twrw", 999, 16),
    TableSpec("cw", 500, 64),
    TableSpec("twcw", 400, 48),
    TableSpec("dp", 50, 16, dtype="fp16"),
)
LAYOUT = {
    "tw": ("table_wise", [5]),
    "rw": ("row_wise", list(range(16))),
    "twrw": ("table_row_wise", list(range(8, 16))),
    "cw": ("column_wise", [3, 12, 7, 0]),
    "twcw": ("table_column_wise", [10, 9]),
    "dp": ("data_parallel", []),
}


@pytest.fixture(scope="module")
def plan():
    return manual_plan(SPECS, TOPO, LAYOUT)


def test_embedding_configs_carry_dims_rows_features_and_dtype():
    bags, sequences = to_embedding_configs(SPECS + (TableSpec("seq", 10, 8, pooled=False),))
    assert [c.name for c in bags] == [s.name for s in SPECS] and [c.name for c in sequences] == ["seq"]
    rw = bags[1]
    assert (rw.num_embeddings, rw.embedding_dim, rw.feature_names) == (1001, 32, ["rw_a", "rw_b"])
    assert bags[-1].data_type == DataType.FP16 and bags[0].data_type == DataType.FP32


def test_sequence_tables_of_different_dims_are_rejected():
    with pytest.raises(ValueError, match="one embedding_dim"):
        to_embedding_configs((TableSpec("a", 10, 8, pooled=False), TableSpec("b", 10, 16, pooled=False)))


def test_shard_metadata_is_exact(plan):
    tr = to_torchrec_plan(plan, "sparse.ebc").plan["sparse.ebc"]
    assert tr["tw"].ranks == [5] and tr["tw"].compute_kernel == "fused"
    [tw] = tr["tw"].sharding_spec.shards
    assert (tw.shard_offsets, tw.shard_sizes, str(tw.placement)) == ([0, 0], [1000, 64], "rank:5/cuda:5")
    rw = tr["rw"].sharding_spec.shards
    assert [m.shard_sizes for m in rw] == [[63, 32]] * 15 + [[1001 - 15 * 63, 32]]
    assert [m.shard_offsets[0] for m in rw] == [63 * i for i in range(16)] and tr["rw"].ranks == list(range(16))
    twrw = tr["twrw"].sharding_spec.shards
    assert tr["twrw"].ranks == list(range(8, 16)) and [m.shard_sizes[0] for m in twrw] == [125] * 7 + [124]
    assert str(twrw[1].placement) == "rank:9/cuda:1"
    cw = tr["cw"].sharding_spec.shards
    assert tr["cw"].ranks == [3, 12, 7, 0] and [m.shard_offsets for m in cw] == [[0, 0], [0, 16], [0, 32], [0, 48]]
    assert [m.shard_sizes for m in tr["twcw"].sharding_spec.shards] == [[400, 24], [400, 24]]
    dp = tr["dp"]
    assert (dp.sharding_type, dp.compute_kernel, dp.ranks, dp.sharding_spec) == ("data_parallel", "dense", list(range(16)), None)


def test_matches_torchrecs_own_plan_constructors(plan):
    """Where TorchRec has a helper for a layout, it builds the same ParameterSharding as ours."""
    specs = tuple(s for s in SPECS if s.name != "twcw")
    bags, _ = to_embedding_configs(specs)
    ebc = EmbeddingBagCollection(tables=bags, device=torch.device("meta"))
    theirs = construct_module_sharding_plan(
        ebc, {"tw": table_wise(rank=5), "rw": row_wise(), "twrw": table_row_wise(host_index=1),
              "cw": column_wise(ranks=[3, 12, 7, 0]), "dp": data_parallel()},
        local_size=8, world_size=16, device_type="cuda")
    ours = to_torchrec_plan(plan).plan[""]
    for name, ps in theirs.items():
        assert ours[name].sharding_type == ps.sharding_type and ours[name].ranks == ps.ranks, name
        if ps.sharding_spec is None:
            assert ours[name].sharding_spec is None
        else:
            assert ours[name].sharding_spec.shards == ps.sharding_spec.shards, name


def test_round_trip_keeps_placements_and_cost(plan):
    back = from_torchrec_plan(to_torchrec_plan(plan), SPECS, TOPO)
    assert back.tables == plan.tables
    assert back.max_rank_ms == pytest.approx(plan.max_rank_ms, rel=1e-12)


def test_from_torchrec_merges_adjacent_column_blocks_on_one_rank():
    spec = TableSpec("t", 100, 256)
    tr = to_torchrec_plan(manual_plan((spec,), TOPO, {"t": ("column_wise", [2, 4])}))
    tr.plan[""]["t"].ranks = [4, 4]
    back = from_torchrec_plan(tr, (spec,), TOPO)
    assert back.tables[0].shards == (Shard(4, 0, 100, 0, 256),)


@pytest.mark.parametrize("layout, match", [
    ({"rw": ("row_wise", list(range(8)))}, r"row block i of ceil\(rows/16\) rows on the i-th of all 16 ranks"),
    ({"rw": ("row_wise", [1, 0] + list(range(2, 16)))}, r"\(rank, row_offset, num_rows\) \[\(1, 0, 63\), \(0, 63, 63\)"),
    ({"twrw": ("table_row_wise", [8, 9, 10, 11])}, "the 8 ranks of host 1"),
])
def test_row_layouts_torchrec_cannot_run_raise(plan, layout, match):
    p = manual_plan(SPECS, TOPO, {**LAYOUT, **layout})
    with pytest.raises(ValueError, match=match) as err:
        to_torchrec_plan(p)
    assert "table " in str(err.value) and "constraints.tables." in str(err.value)


SEQ_TOPO = Topology(world_size=2, local_world_size=2, hbm_gib=1.0, device="cpu")


@pytest.mark.parametrize("specs, layout, match", [
    ((TableSpec("s", 10, 8, pooled=False),), {"s": ("data_parallel", [])}, "cannot run data_parallel.*on CPU"),
    ((TableSpec("s", 10, 8, pooled=False),), {"s": ("table_row_wise", [0, 1])}, "shards sequence tables only as"),
    ((TableSpec("s", 10, 8, pooled=False), TableSpec("u", 10, 8, pooled=False)),
     {"s": ("column_wise", [0, 1]), "u": ("column_wise", [1])}, "one column-shard width"),
])
def test_sequence_layouts_torchrec_cannot_run_raise(specs, layout, match):
    with pytest.raises(ValueError, match=match):
        to_torchrec_plan(manual_plan(specs, SEQ_TOPO, layout))


def test_mixed_pooled_and_sequence_need_two_module_paths():
    specs = (TableSpec("p", 10, 8), TableSpec("s", 10, 8, pooled=False))
    p = manual_plan(specs, SEQ_TOPO, {"p": ("table_wise", [0]), "s": ("table_wise", [1])})
    with pytest.raises(ValueError, match="sequence_module_path"):
        to_torchrec_plan(p)
    tr = to_torchrec_plan(p, "ebc", sequence_module_path="ec")
    assert list(tr.plan["ebc"]) == ["p"] and list(tr.plan["ec"]) == ["s"]


def test_from_torchrec_rejects_offloaded_kernels_and_missing_tables(plan):
    tr = to_torchrec_plan(plan)
    tr.plan[""]["tw"] = dataclasses.replace(tr.plan[""]["tw"], compute_kernel="fused_uvm_caching")
    with pytest.raises(ValueError, match="'tw'.*fused_uvm_caching without cache_params.load_factor"):
        from_torchrec_plan(tr, SPECS, TOPO)
    tr.plan[""]["tw"] = dataclasses.replace(tr.plan[""]["tw"], compute_kernel="key_value")
    with pytest.raises(ValueError, match="'tw'.*compute kernel 'key_value'; embshard models 'fused'"):
        from_torchrec_plan(tr, SPECS, TOPO)
    with pytest.raises(ValueError, match=r"missing \['extra'\]"):
        from_torchrec_plan(to_torchrec_plan(plan), SPECS + (TableSpec("extra", 10, 8),), TOPO)


def test_topology_converts_units():
    tr = to_torchrec_topology(TOPO)
    assert (tr.world_size, tr.local_world_size, tr.compute_device) == (16, 8, "cuda")
    assert tr.devices[0].storage.hbm == 4 * 1024**3
    assert tr.intra_host_bw == pytest.approx(150e9 / 1e3) and tr.inter_host_bw == pytest.approx(25e9 / 1e3)
    assert tr.hbm_mem_bw == pytest.approx(1500e9 / 1e3) and tr.hbm_mem_bw != HBM_MEM_BW
    cpu = to_torchrec_topology(SEQ_TOPO)
    assert cpu.devices[0].storage.ddr == 1024**3 and cpu.devices[0].storage.hbm == 0 and cpu.ddr_mem_bw == pytest.approx(10e9 / 1e3)


def test_estimate_sums_shards_by_rank(plan):
    per_rank_ms = torchrec_estimate(plan)
    assert len(per_rank_ms) == 16 and all(ms > 0 for ms in per_rank_ms)  # DP puts work on every rank
    only_dp = manual_plan(SPECS[-1:], TOPO, {"dp": ("data_parallel", [])})
    dp_ms = torchrec_estimate(only_dp)[0]
    tw = manual_plan(SPECS[:1], TOPO, {"tw": ("table_wise", [5])})
    tw_ms = torchrec_estimate(tw)
    assert tw_ms[5] > 0 and sum(tw_ms) == tw_ms[5]
    assert per_rank_ms[5] > tw_ms[5] + dp_ms * 0.999


def test_estimate_rejects_layouts_torchrec_cannot_run():
    p = manual_plan(SPECS, TOPO, {**LAYOUT, "rw": ("row_wise", [0, 1])})
    with pytest.raises(ValueError, match="'rw'"):
        torchrec_estimate(p)


def test_estimate_of_torchrecs_plan_equals_its_planners_rating():
    """torchrec_estimate scores a plan exactly as TorchRec's planner scored it."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.proposers import GreedyProposer
    from torchrec.distributed.planner.storage_reservations import FixedPercentageStorageReservation

    from embshard.interop.torchrec import torchrec_constraints

    topo = Topology(world_size=4, local_world_size=2, hbm_gib=0.1)
    specs = (TableSpec("a", 200_000, 64, pooling_factor=5.0), TableSpec("b", 3000, 32), TableSpec("c", 40_000, 128, pooling_factor=20.0),
             TableSpec("d", 100, 16), TableSpec("e", 90_000, 256, feature_names=("e1", "e2")))
    bags, _ = to_embedding_configs(specs)
    tr_topo = to_torchrec_topology(topo)
    planner = EmbeddingShardingPlanner(topology=tr_topo, batch_size=topo.batch_size_per_rank,
                                       constraints=torchrec_constraints(specs), stats=[], debug=False, proposer=GreedyProposer(),
                                       storage_reservation=FixedPercentageStorageReservation(topo.reserved_fraction))
    tr_plan = planner.plan(EmbeddingBagCollection(tables=bags, device=torch.device("meta")), [EmbeddingBagCollectionSharder()])
    rating_ms = NoopPerfModel(tr_topo).rate(planner._best_plan)
    ours = from_torchrec_plan(TrShardingPlan({"": tr_plan.plan[""]}), specs, topo)
    assert max(torchrec_estimate(ours)) == pytest.approx(rating_ms, rel=1e-9)
    assert len({t.sharding_type for t in ours.tables}) >= 3  # the check covers split layouts, not only table_wise


@pytest.mark.parametrize("forward,backward", [("fp16", "bf16"), ("bf16", "fp32"), ("fp32", "fp32")])
def test_wire_dtypes_export_as_qcomms_config(forward, backward):
    plan = manual_plan(SPECS, dataclasses.replace(TOPO, comms=CommsPrecision(forward, backward)), LAYOUT)
    config = to_torchrec_qcomms(plan)
    assert (config.forward_precision, config.backward_precision) == (CommType(forward), CommType(backward))
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    registry = get_qcomm_codecs_registry(config)  # what TorchRec's sharders quantize with; None: plain fp32 collectives
    assert (registry is None) == (forward == backward == "fp32")
    for name, codecs in (registry or {}).items():
        assert (codecs.forward.quantized_dtype, codecs.backward.quantized_dtype) == (dtypes[forward], dtypes[backward]), name


def test_quantized_data_parallel_all_reduce_does_not_export():
    quantized_dp = dataclasses.replace(TOPO, comms=CommsPrecision("fp16", "fp16", dp_allreduce="bf16"))
    with pytest.raises(ValueError, match="comms.dp_allreduce=bf16, but TorchRec all-reduces data-parallel tables in fp32"):
        to_torchrec_qcomms(manual_plan(SPECS, quantized_dp, LAYOUT))
    no_dp = {**LAYOUT, "dp": ("table_wise", [1])}
    assert to_torchrec_qcomms(manual_plan(SPECS, quantized_dp, no_dp)).forward_precision is CommType.FP16
