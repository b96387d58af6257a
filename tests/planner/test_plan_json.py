"""ShardingPlan JSON: round trip, versioning, and rejection of damaged files."""

import json

import pytest

from embshard.planner import ShardingPlan, plan
from embshard.specs import TableSpec
from embshard.topology import Topology
from embshard.workloads import generate_tables


@pytest.fixture(scope="module")
def a_plan():
    specs = generate_tables(30, seed=2, sequence_fraction=0.3)
    return plan(specs, Topology(world_size=8, local_world_size=4, hbm_gib=32), time_budget_s=2)


def test_round_trip_is_identical(a_plan, tmp_path):
    path = tmp_path / "plan.json"
    a_plan.save(path)
    loaded = ShardingPlan.load(path)
    assert loaded == a_plan
    assert loaded.to_json() == a_plan.to_json()


def test_json_has_the_documented_fields(a_plan):
    raw = json.loads(a_plan.to_json())
    assert raw["schema_version"] == 1 and raw["input_hash"].startswith("sha256:")
    t = raw["tables"][0]
    assert set(t) == {"name", "sharding_type", "compute_kernel", "shards"}
    assert set(t["shards"][0]) == {"rank", "row_offset", "num_rows", "col_offset", "num_cols"}
    assert set(raw["ranks"][0]) == {"rank", "perf_ms", "memory_bytes"}
    assert raw["lower_bound_ms"] <= raw["objective_ms"]
    assert raw["topology"]["world_size"] == 8


def test_hash_depends_on_inputs():
    specs = [TableSpec("a", 100, 8)]
    p1 = plan(specs, Topology(world_size=2, local_world_size=2, hbm_gib=1), time_budget_s=1)
    p2 = plan(specs, Topology(world_size=2, local_world_size=2, hbm_gib=2), time_budget_s=1)
    assert p1.input_hash != p2.input_hash


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.update(schema_version=99), "schema_version"),
    (lambda d: d.pop("tables"), "plan.tables: missing"),
    (lambda d: d["tables"][0]["shards"][0].update(rank=999), "is not a rank"),
    (lambda d: d["tables"][0].update(sharding_type="diagonal"), "unknown sharding type 'diagonal'"),
    (lambda d: d["tables"][0]["shards"][0].update(num_rows=10**12), "outside the"),
    (lambda d: d["tables"].pop(), "do not match the table specs"),
])
def test_damaged_plan_is_rejected(a_plan, damage, message):
    raw = json.loads(a_plan.to_json())
    damage(raw)
    with pytest.raises(ValueError, match=message):
        ShardingPlan.from_json(json.dumps(raw))


def test_not_json_is_rejected(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        ShardingPlan.load(path)
