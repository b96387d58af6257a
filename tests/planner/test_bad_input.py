"""Bad table specs, topologies and constraints are rejected with the field's path."""

import pytest

from embshard.planner import Constraints, PlanInfeasibleError, plan
from embshard.specs import TableSpec, load_tables_file, read_tables_file, tables_from_list
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


@pytest.mark.parametrize("text, message", [
    ("tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\ntopology: {world_size: 4, hbm_gib: -1}\n",
     r"t\.yaml: topology\.hbm_gib: must be a positive number, got -1"),
    ("tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\ntopology: {ranks: 4}\n",
     r"t\.yaml: topology: unknown key\(s\) \['ranks'\]"),
    ("tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\ntopology: 8\n", r"t\.yaml: topology: expected a mapping"),
    ("tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\nconstraints: {tables: {b: {ranks: [0]}}}\n",
     r"t\.yaml: constraints\.tables\.b: no table named 'b'"),
    ("tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\ntopology: {world_size: 2, local_world_size: 2}\n"
     "constraints: {tables: {a: {ranks: [5]}}}\n", r"t\.yaml: constraints\.tables\.a\.ranks\[0\]: rank 5 does not exist"),
    ("tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\nplanner: {use_ilp: true}\n",
     r"t\.yaml: unknown top-level key\(s\) \['planner'\]"),
])
def test_plain_tables_file_errors_name_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_tables_file(path)


def test_plain_tables_file_blocks_are_read(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\ntopology: {local_world_size: 2, device: cpu}\n"
                    "constraints: {tables: {a: {sharding_types: [row_wise]}}}\n")
    assert read_tables_file(path) == {"tables": [{"name": "a", "num_embeddings": 10, "embedding_dim": 8}],
                                      "topology": {"local_world_size": 2, "device": "cpu"},
                                      "constraints": {"tables": {"a": {"sharding_types": ["row_wise"]}}}}
    specs, topology = load_tables_file(path)
    assert specs == (TableSpec("a", 10, 8),) and topology == {"local_world_size": 2, "device": "cpu"}


def test_binary_tables_file_is_named(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_bytes(b"tables: [\xff\xfe]\n")
    with pytest.raises(ValueError, match=r"t\.yaml: not UTF-8 text \(invalid start byte at byte 9\)"):
        read_tables_file(path)
