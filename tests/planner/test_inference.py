"""Planner inference mode (serving): forward-only time and storage, int8 rows, exact bytes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from embshard.cli import CONFIG_DIR
from embshard.planner import plan
from embshard.planner.api import PlanInfeasibleError, evaluate, placement_for
from embshard.planner.cost.perf import data_parallel_perf
from embshard.planner.enumerate import forward_only
from embshard.planner.search.greedy import default_order, greedy_retrying, largest_shard_needs, replication_prepass
from embshard.planner.search.problem import build_problem
from embshard.planner.types import Constraints, ShardingType
from embshard.specs import TableSpec, load_tables_file
from embshard.topology import Topology
from embshard.workloads import generate_tables

TOPO = Topology(world_size=2, local_world_size=2, hbm_gib=1.0, batch_size_per_rank=4, device="cpu")


def test_int8_rows_carry_fbgemm_scale_and_bias():
    assert TableSpec("t", 10, 8, dtype="int8").row_bytes(8) == 8 + 4
    assert TableSpec("t", 10, 8, dtype="fp16").row_bytes(4) == 8
    assert TableSpec("t", 10, 8).row_bytes(8) == 32
    with pytest.raises(ValueError, match=r"dtype: must be one of \['fp16', 'fp32', 'int8'\]"):
        TableSpec.from_dict({"name": "t", "num_embeddings": 10, "embedding_dim": 8, "dtype": "int4"})


@pytest.mark.parametrize("dtype, inference, rank0, rank1", [
    # weights 100 rows x (8 + 4) B; ids 8 x 8 B + lengths 8 x 8 B (int64) + outputs 8 bags x 8 x 4 B (fp32, no gradient);
    # every rank: its 4 bags' fp32 outputs (128 B)
    ("int8", True, {"weights_bytes": 1200, "optimizer_bytes": 0, "io_bytes": 384 + 128}, 128),
    # fp32 serving: 100 x 32 B of weights, the same buffers
    ("fp32", True, {"weights_bytes": 3200, "optimizer_bytes": 0, "io_bytes": 384 + 128}, 128),
    # training: rowwise_adagrad state (4 B per row), outputs and their gradients (2 x 256 B, 2 x 128 B)
    ("fp32", False, {"weights_bytes": 3200, "optimizer_bytes": 400, "io_bytes": 640 + 256}, 256),
])
def test_exact_bytes_of_a_table_wise_table(dtype, inference, rank0, rank1):
    spec = TableSpec("a", 100, 8, dtype=dtype)
    p = evaluate([spec], TOPO, [placement_for(spec, TOPO, ShardingType.TABLE_WISE, (0,))], inference=inference)
    got = p.ranks[0].storage.to_dict()
    assert {k: got[k] for k in rank0} == rank0
    assert p.ranks[1].storage.total_bytes == rank1


def test_inference_costs_the_forward_pass_only():
    specs = [TableSpec("a", 5000, 16), TableSpec("b", 3000, 16, pooling_factor=4.0), TableSpec("c", 200, 16),
             TableSpec("s", 1000, 16, pooled=False, pooling_factor=3.0)]
    train = plan(specs, TOPO, time_budget_s=0.5)
    serve = plan(specs, TOPO, time_budget_s=0.5, inference=True)
    assert serve.search["inference"] is True and train.search["inference"] is False
    for r in serve.ranks:
        assert r.perf.output_dist_bwd_ms == r.perf.lookup_bwd_ms == r.perf.dp_allreduce_ms == 0.0
        assert r.storage.optimizer_bytes == 0
    assert serve.max_rank_ms < train.max_rank_ms
    assert sum(r.perf.lookup_bwd_ms for r in train.ranks) > 0


def test_inference_plan_fits_where_training_does_not():
    # 1M x 64 fp32 with adam: 256 MiB of weights + 512 MiB of state; 0.5 GiB per rank keeps 0.45 GiB for shards
    big = [TableSpec("big", 1_000_000, 64, optimizer="adam")]
    topo = Topology(world_size=1, local_world_size=1, hbm_gib=0.5, batch_size_per_rank=64, device="cpu")
    with pytest.raises(PlanInfeasibleError, match="infeasible"):
        plan(big, topo, time_budget_s=0.2)
    served = plan(big, topo, time_budget_s=0.2, inference=True)
    assert served.ranks[0].storage.weights_bytes == 1_000_000 * 64 * 4
    # 2M rows: fp32 weights (512 MiB) do not fit even for serving; int8 (2M x 68 B) does
    huge = TableSpec("huge", 2_000_000, 64)
    with pytest.raises(PlanInfeasibleError):
        plan([huge], topo, time_budget_s=0.2, inference=True)
    int8 = plan([TableSpec("huge", 2_000_000, 64, dtype="int8")], topo, time_budget_s=0.2, inference=True)
    assert int8.ranks[0].storage.weights_bytes == 2_000_000 * (64 + 4)


def test_replicas_leave_room_for_the_remaining_tables():
    """Serving makes replicas cheap, so the greedy start would replicate the largest tables until the
    rest fit nowhere; it keeps room for them: criteo_small (51 MiB fp32) on 2 ranks of 0.045 GiB."""
    specs, _ = load_tables_file(Path(CONFIG_DIR) / "tables" / "criteo_small.yaml")
    topo = Topology(world_size=2, local_world_size=2, hbm_gib=0.045, batch_size_per_rank=512, device="cpu",
                    replicated_dp_lookup=True)
    p = plan(specs, topo, time_budget_s=0.5, inference=True)
    types = {t.sharding_type for t in p.tables}
    assert ShardingType.DATA_PARALLEL in types and ShardingType.TABLE_WISE in types
    assert all(r.storage.total_bytes <= topo.shard_memory_cap_bytes for r in p.ranks)


def test_serving_prices_replicas_as_local_lookups_whatever_the_training_mode():
    """Serving collections look replicas up locally (no id exchange, own samples only), so an inference
    plan costs a replica the same on a profile whose training runs replicated look-ups."""
    spec = TableSpec("t", 10_000, 32, pooling_factor=8.0)
    replicated = replace(TOPO, replicated_dp_lookup=True)

    def served_ms(topo: Topology, inference: bool) -> float:
        placement = placement_for(spec, topo, ShardingType.DATA_PARALLEL, ())
        return evaluate([spec], topo, [placement], inference=inference).ranks[0].perf.total_ms

    assert served_ms(replicated, inference=True) == served_ms(TOPO, inference=True)
    assert forward_only(data_parallel_perf(spec, replicated)).total_ms > served_ms(TOPO, inference=True)


def test_serving_plan_of_generated_tables_fits_where_the_training_plan_does():
    """100 generated tables on 64 x 16 GiB: serving replicas are cheap, so both greedy starts replicated
    until a 2 GiB table (table-wise only: too small in time to split) fitted no rank, and the plan was
    infeasible though the training plan fits. The replication prepass keeps room for the largest shard
    still to place, a replica in the greedy pass leaves it on the emptiest rank, and a unit that fits
    nowhere goes first in another pass."""
    specs = generate_tables(100, seed=0)
    topo = Topology(world_size=64, local_world_size=8, hbm_gib=16)
    problem = build_problem(specs, topo, Constraints(), inference=True)
    needs = largest_shard_needs(problem)
    replicas = replication_prepass(problem)
    replica_bytes = sum(problem.units[u].cands[c].every_mem for u, c in replicas.items())
    assert replica_bytes + max(n for u, n in enumerate(needs) if u not in replicas) <= problem.free_bytes  # was 13.0 of 14.4 GiB
    for start in (replicas, None):  # both starts place every table (each raised Unplaceable for t0038)
        state = greedy_retrying(problem, default_order(problem), start)
        assert all(c is not None for c in state.choice)
    served = plan(specs, topo, time_budget_s=2, inference=True)
    assert max(r.storage.total_bytes for r in served.ranks) <= topo.shard_memory_cap_bytes
    assert served.max_rank_ms < plan(specs, topo, time_budget_s=2).max_rank_ms  # forward only: cheaper than training
