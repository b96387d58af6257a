"""Bad table specs, topologies and constraints are rejected with the field's path."""

import re

import pytest

from embshard.planner import Constraints, PlanInfeasibleError, ShardingType, TableConstraint, plan
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
    with pytest.raises(PlanInfeasibleError, match=r"huge needs 47\.87 GiB on one rank even as RW2 \(weights 47\.68 GiB; 44\.27 GiB over\)"
                       r".*Fix: raise topology\.hbm_gib, add ranks") as e:
        plan(specs, topo, time_budget_s=1)
    assert "batch_size_per_rank (" not in str(e.value)  # the buffers are not what is in the way


def test_output_buffers_that_fill_a_rank_are_named_with_the_batch_size_fix():
    # 20 tables x 128 dims x 65,536 samples: 1.25 GiB of outputs and gradients on every rank, whatever the layout
    specs = [TableSpec(f"t{i}", 1000, 128) for i in range(20)]
    topo = Topology(world_size=8, local_world_size=8, hbm_gib=0.5, batch_size_per_rank=65536)
    with pytest.raises(PlanInfeasibleError) as e:
        plan(specs, topo, time_budget_s=1)
    message = str(e.value)
    assert message.startswith("infeasible: the output buffers alone do not fit a rank: hbm_gib=0.5 leaves 0.45 GiB after 0.05 GiB "
                              "reserved for dense parameters and activations (topology.reserved_fraction=0.1), but every rank needs "
                              "1.25 GiB of buffers for its own 65536 samples")
    assert "more ranks do not shrink them" in message and "add ranks" not in message
    assert not re.search(r"-\d", message)  # no negative budget
    fixed = re.search(r"lower topology\.batch_size_per_rank to (\d+) or less", message)
    hbm = re.search(r"raise topology\.hbm_gib to ([\d.]+) or more", message)
    assert fixed and hbm and int(fixed[1]) == 11796  # 65536 x 0.45 / 1.25 / 2
    # either fix really plans
    for fix in ({"batch_size_per_rank": int(fixed[1])}, {"hbm_gib": float(hbm[1])}):
        p = plan(specs, Topology(**{**topo.to_dict(), **fix}), time_budget_s=0.5)
        assert max(r.storage.total_bytes for r in p.ranks) <= p.topology.shard_memory_cap_bytes


def test_batch_sized_shard_buffers_name_the_batch_size():
    # table-wise or row-wise, a shard holds every sample's output (row blocks each send a partial sum)
    specs = [TableSpec("wide", 1000, 256)]
    topo = Topology(world_size=8, local_world_size=8, hbm_gib=1, batch_size_per_rank=131072)
    only = Constraints(tables={"wide": TableConstraint(sharding_types=(ShardingType.TABLE_WISE, ShardingType.ROW_WISE))})
    with pytest.raises(PlanInfeasibleError) as e:
        plan(specs, topo, only, time_budget_s=1)
    assert re.search(r"wide needs 2\.01 GiB on one rank even as RW8 \(I/O buffers 2\.01 GiB; 1\.36 GiB over\)\. Fix: raise "
                     r"topology\.hbm_gib, allow column_wise for these tables, a smaller topology\.batch_size_per_rank \(buffers that "
                     r"scale with it take 2\.26 GiB of the rank\)$", str(e.value)), str(e.value)
    assert "0.25 GiB of output buffers for the rank's own 131072 samples" in str(e.value)
    assert "add ranks" not in str(e.value)  # more ranks, a larger global batch: more buffers per shard


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


def test_input_too_large_for_this_machine_is_refused_up_front(monkeypatch):
    from embshard.planner import api, footprint
    from embshard.workloads import generate_tables

    monkeypatch.setattr(footprint, "available_bytes", lambda: 300 * 2**20)
    monkeypatch.setattr(api, "build_problem", lambda *a, **k: pytest.fail("built the problem before checking memory"))
    with pytest.raises(footprint.PlannerMemoryError, match=re.escape(
            "planning 1000 tables on topology.world_size=4096 needs about 0.74 GiB of this machine's memory (estimate: "
            "256 MiB + 128 bytes per table and rank) but 0.29 GiB is available; fix: plan on a machine with more free memory, "
            "or fewer ranks (at most about 360 for 1000 tables here) or fewer tables")):
        plan(generate_tables(1000), Topology(world_size=4096, local_world_size=8))
    monkeypatch.setattr(footprint, "available_bytes", lambda: None)  # unknown (no /proc/meminfo, no psutil): no check
    footprint.check_planner_memory(10**6, 10**6)


def test_cli_refuses_input_too_large_for_this_machine_in_one_line(monkeypatch, capsys, tmp_path):
    import sys

    from embshard import plan_cli
    from embshard.planner import footprint

    monkeypatch.setattr(footprint, "available_bytes", lambda: 100 * 2**20)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["embshard-plan", "tables=criteo_tb", "topology.world_size=4096", "topology.hbm_gib=16"])
    with pytest.raises(SystemExit) as exit_info:
        plan_cli.main()
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("embshard-plan: error: planning 26 tables on topology.world_size=4096 needs about 0.26 GiB")
    assert not (tmp_path / "outputs").exists()
