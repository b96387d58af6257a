"""Bad table specs, topologies and constraints are rejected with the field's path."""

import pytest

from embshard.planner import Constraints, PlanInfeasibleError, plan
from embshard.specs import TableSpec, load_tables_file, tables_from_list
from embshard.topology import Topology

GOOD = {"name": "a", "num_embeddings": 10, "embedding_dim": 8}


@pytest.mark.parametrize("table, message", [
    ({**GOOD, "num_embeddings": 0}, r"tables\[0\] \(a\)\.num_embeddings: must be a positive integer, got 0"),
    ({**GOOD, "embedding_dim": -4}, r"tables\[0\] \(a\)\.embedding_dim: must be a positive integer"),
    ({**GOOD, "pooling_factor": 0}, r"pooling_factor: must be a positive number"),
    ({**GOOD, "dtype": "int3"}, r"dtype: must be one of"),
    ({**GOOD, "optimizer": "lamb"}, r"optimizer: must be one of"),
    ({**GOOD, "rows": 5}, r"tables\[0\]: unknown key\(s\) \['rows'\]"),
    ({"name": "a", "embedding_dim": 8}, r"tables\[0\]\.num_embeddings: missing"),
])
def test_bad_table_spec(table, message):
    with pytest.raises(ValueError, match=message):
        tables_from_list([table])


def test_duplicate_names():
    with pytest.raises(ValueError, match=r"tables\[1\]\.name: duplicate table name 'a'"):
        tables_from_list([GOOD, GOOD])


def test_world_size_not_multiple_of_local():
    with pytest.raises(ValueError, match=r"topology\.world_size: 12 is not a multiple of local_world_size 8"):
        Topology.from_dict({"world_size": 12, "local_world_size": 8})


@pytest.mark.parametrize("raw, message", [
    ({"tables": {"zz": {"ranks": [0]}}}, r"constraints\.tables\.zz: no table named 'zz'"),
    ({"tables": {"a": {"ranks": [7]}}}, r"constraints\.tables\.a\.ranks\[0\]: rank 7 does not exist; ranks are 0\.\.3"),
    ({"tables": {"a": {"sharding_types": ["diagonal"]}}}, r"constraints\.tables\.a\.sharding_types\[0\]: unknown sharding type 'diagonal'"),
    ({"keep_together": [["a", "nope"]]}, r"constraints\.keep_together\[0\]: no table named 'nope'"),
])
def test_bad_constraints(raw, message):
    with pytest.raises(ValueError, match=message):
        Constraints.from_dict(raw, ["a", "b"], world_size=4)


def test_infeasible_names_tables_and_fix():
    specs = [TableSpec("huge", 100_000_000, 256), TableSpec("ok", 100, 8)]
    topo = Topology(world_size=2, local_world_size=2, hbm_gib=4)
    with pytest.raises(PlanInfeasibleError, match=r"huge needs .* GiB on one rank even as RW2 .*GiB over.*Fix: raise topology\.hbm_gib"):
        plan(specs, topo, time_budget_s=1)


def test_aggregate_infeasible_names_shortfall():
    specs = [TableSpec(f"t{i}", 3_000_000, 128) for i in range(8)]  # ~1.4 GiB each with state
    topo = Topology(world_size=4, local_world_size=4, hbm_gib=2)
    with pytest.raises(PlanInfeasibleError, match=r"GiB short.*topology\.hbm_gib >="):
        plan(specs, topo, time_budget_s=1)


def test_tables_file_errors(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("tables:\n  - {name: a, num_embeddings: 10, embedding_dim: 0}\n")
    with pytest.raises(ValueError, match=r"t\.yaml: tables\[0\] \(a\)\.embedding_dim"):
        load_tables_file(path)
    path.write_text("tables: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_tables_file(path)
