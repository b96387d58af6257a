"""embshard-plan end to end, as a user runs it: a subprocess per command line.

Commands start together (each spends seconds importing), then each test checks one result.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.topology import GIB

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).parent / "embshard-plan")
FAST = ["planner.time_budget_s=0.5", "planner.use_ilp=false"]

USER_FILES = {
    "mine.yaml": """# @package _global_
tables:
  - {name: a, num_embeddings: 1000, embedding_dim: 16, pooling_factor: 2.0}
  - {name: b, num_embeddings: 50000, embedding_dim: 32, pooling_factor: 8.0}
  - {name: c, num_embeddings: 20, embedding_dim: 8, pooled: false}
topology: {world_size: 4, local_world_size: 2, hbm_gib: 1, device: cpu}
constraints:
  tables: {b: {sharding_types: [row_wise]}}
""",
    "badspec.yaml": """# @package _global_
tables:
  - {name: a, num_embeddings: 10, embedding_dim: 8}
  - {name: b, num_embeddings: -5, embedding_dim: 8}
""",
    "noheader.yaml": "tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\n",
    "broken.yaml": "# @package _global_\ntables: [{name: a, num_embeddings: 10\n",
    "plain.yaml": """tables:
  - {name: a, num_embeddings: 1000, embedding_dim: 16, pooling_factor: 2.0}
  - {name: b, num_embeddings: 50000, embedding_dim: 32, pooling_factor: 8.0}
topology: {world_size: 4, local_world_size: 2, hbm_gib: 1, device: cpu}
constraints:
  tables: {b: {sharding_types: [row_wise]}}
""",
    "plain_badtopo.yaml": "tables: [{name: a, num_embeddings: 10, embedding_dim: 8}]\ntopology: {world_size: 4, hbm_gib: -1}\n",
}
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))  # a picture given as a tables file

# name -> (extra arguments, text the one-line error must contain)
BAD = {
    "bad_spec": (["--config-dir", "{user}", "tables=badspec"], "tables[1] (b).num_embeddings: must be a positive integer, got -5"),
    "infeasible": (["topology.world_size=2", "topology.local_world_size=2", "topology.hbm_gib=0.05"], "cat_2"),
    "host_memory_short": (["tables=criteo_tb_measured", "topology.world_size=8", "topology.hbm_gib=8", "topology.ddr_gib=2"],
                          "host memory at least 13.2 GiB short (with HBM used to the full they need 29.2 GiB of it, "
                          "8 ranks x topology.ddr_gib=2 = 16.0 GiB)"),
    "buffers_fill_rank": (["topology.hbm_gib=0.5", "topology.batch_size_per_rank=65536"],
                          "every rank needs 1.62 GiB of buffers for its own 65536 samples"),
    "not_whole_hosts": (["topology.world_size=12"], "topology.world_size: 12 is not a multiple of local_world_size 8"),
    "unknown_sharding_type": (["+constraints.tables.cat_0.sharding_types=[bogus]"], "unknown sharding type 'bogus'"),
    "constraint_missing_table": (["constraints.keep_together=[[cat_0,nope]]"], "constraints.keep_together[0]: no table named 'nope'"),
    "constraint_missing_rank": (["+constraints.tables.cat_0.ranks=[99]"], "constraints.tables.cat_0.ranks[0]: rank 99 does not exist"),
    "unreadable_file": (["--config-dir", "{user}", "tables=broken"], "broken.yaml"),
    "not_utf8": (["--config-dir", "{user}", "tables=picture"], "tables/picture.yaml: not UTF-8 text (invalid start byte"),
    "missing_header": (["--config-dir", "{user}", "tables=noheader"], "# @package _global_"),
    "unknown_option": (["tables=nope"], "Could not find 'tables/nope'"),
    "bad_override": (["topology.world_size=="], "Error parsing override 'topology.world_size=='"),
    "unwritable_out": (["out={user}/tables/mine.yaml/plan.json"], "cannot write the plan"),
    "bad_planner_option": (["planner.ilp_time_s=-1"], "planner.ilp_time_s: must be a positive number of seconds, got -1"),
    "plain_file_bad_field": (["tables_file={user}/tables/badspec.yaml"],
                             "/tables/badspec.yaml: tables[1] (b).num_embeddings: must be a positive integer, got -5"),
    "plain_file_bad_topology": (["tables_file={user}/tables/plain_badtopo.yaml"],
                                "/tables/plain_badtopo.yaml: topology.hbm_gib: must be a positive number, got -1"),
    "plain_file_missing": (["tables_file={user}/nope.yaml"], "/nope.yaml: cannot read tables file (No such file or directory)"),
    "plain_file_and_option": (["tables_file={user}/tables/plain.yaml", "tables=criteo_tb"],
                              "also tables=criteo_tb; give either tables=NAME"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Start every command at once; returns name -> (exit status, stdout, stderr, its cwd and out dir)."""
    base = tmp_path_factory.mktemp("cli")
    user = base / "user"
    (user / "tables").mkdir(parents=True)
    for name, text in USER_FILES.items():
        (user / "tables" / name).write_text(text)
    (user / "tables" / "picture.yaml").write_bytes(PNG)
    commands = {
        "file_topology": ["tables=criteo_tb", *FAST],
        "override_topology": ["tables=criteo_tb", "topology.world_size=8", "topology.hbm_gib=40",
                              "topology.batch_size_per_rank=1024", *FAST],
        "user_file": ["--config-dir", str(user), "tables=mine", "planner.time_budget_s=1"],  # ILP on
        "plain_file": [f"tables_file={user}/tables/plain.yaml", "topology.hbm_gib=2", *FAST],
        **{name: [a.format(user=user) for a in args] + FAST for name, (args, _) in BAD.items()},
    }
    procs = {}
    for name, args in commands.items():
        out = base / name
        out.mkdir()
        if not any(a.startswith("out=") for a in args):
            args = [*args, f"out={out}/plan.json"]
        procs[name] = (subprocess.Popen([CLI, *args], cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), out)
    results = {}
    for name, (proc, out) in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        results[name] = (proc.returncode, stdout, stderr, out)
    return results


def ok_plan(runs, name) -> tuple[ShardingPlan, str, Path]:
    rc, stdout, stderr, out = runs[name]
    assert rc == 0, stderr
    assert stderr == ""
    assert sorted(p.name for p in out.iterdir()) == ["plan.json", "plan.png"]  # nothing else littered
    assert (out / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plan = ShardingPlan.load(out / "plan.json")
    for r in plan.ranks:
        assert r.storage.total_bytes <= plan.topology.shard_memory_cap_bytes
    return plan, stdout, out


def test_tables_file_topology_is_used(runs):
    plan, stdout, out = ok_plan(runs, "file_topology")
    topo = plan.topology
    assert (topo.world_size, topo.local_world_size, topo.hbm_gib, topo.batch_size_per_rank) == (16, 8, 80.0, 4096)
    assert [s.name for s in plan.specs] == [f"cat_{i}" for i in range(26)]
    assert plan.spec("cat_19").num_embeddings == 48937457
    assert json.loads((out / "plan.json").read_text())["objective_ms"] == pytest.approx(plan.max_rank_ms)
    assert "tables: 26 on 16 ranks (2 hosts x 8, cuda)" in stdout
    assert f"objective: {plan.max_rank_ms:.3f} ms" in stdout and f"lower bound {plan.lower_bound_ms:.3f} ms" in stdout
    assert "Predicted per-rank load" in stdout
    assert f"wrote {out}/plan.json and {out}/plan.png" in stdout


def test_command_line_overrides_tables_file_topology(runs):
    plan, stdout, _ = ok_plan(runs, "override_topology")
    topo = plan.topology
    assert (topo.world_size, topo.local_world_size, topo.hbm_gib, topo.batch_size_per_rank) == (8, 8, 40.0, 1024)
    assert max(r.storage.total_bytes for r in plan.ranks) / GIB <= 36.0
    assert "tables: 26 on 8 ranks (1 host x 8, cuda)" in stdout


def test_user_tables_file_via_config_dir(runs):
    plan, _, _ = ok_plan(runs, "user_file")
    topo = plan.topology
    assert (topo.world_size, topo.local_world_size, topo.hbm_gib, topo.device) == (4, 2, 1.0, "cpu")
    assert [s.name for s in plan.specs] == ["a", "b", "c"]
    assert plan.spec("c").pooled is False
    assert plan.placement("b").sharding_type is ShardingType.ROW_WISE  # the file's constraints block


def test_plain_tables_file_by_path(runs):
    plan, _, _ = ok_plan(runs, "plain_file")
    topo = plan.topology
    assert (topo.world_size, topo.local_world_size, topo.hbm_gib, topo.device) == (4, 2, 2.0, "cpu")  # the command line wins
    assert [s.name for s in plan.specs] == ["a", "b"]
    assert plan.placement("b").sharding_type is ShardingType.ROW_WISE  # the file's constraints block


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_is_one_line(runs, name):
    rc, stdout, stderr, out = runs[name]
    assert rc == 2
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("embshard-plan: error: ")
    assert BAD[name][1] in lines[0]
    assert not (out / "plan.json").exists()


def test_host_memory_shortfall_names_the_hbm_one_too(runs):
    message = runs["host_memory_short"][2]
    assert "HBM at least 13.8 GiB short (with host memory used to the full they need 70.5 GiB of it" in message
    assert "raise topology.ddr_gib or topology.hbm_gib" in message


def test_infeasible_names_the_fix(runs):
    message = runs["infeasible"][2]
    assert "hbm_gib" in message and "cat_11" in message


def test_every_group_option_composes_and_validates():
    """Each shipped option of each group composes into valid inputs (no planning)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from embshard.cli import CONFIG_DIR
    from embshard.plan_cli import CONFIG_KEYS, planner_options
    from embshard.planner.types import Constraints
    from embshard.specs import tables_from_list
    from embshard.topology import Topology

    groups = {g: sorted(p.stem for p in (Path(CONFIG_DIR) / g).glob("*.yaml")) for g in ("tables", "topology", "planner")}
    documented = {"tables": {"criteo_kaggle", "criteo_tb", "dlrm_150", "dlrm_856"}, "topology": {"cpu", "gpu"}, "planner": {"default"}}
    assert all(documented[g] <= set(options) for g, options in groups.items())  # other apps may add options
    world_size = {"tables=criteo_tb": 16, "topology=cpu": 2}  # the file's topology block; the cpu group
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for group, options in groups.items():
            for option in options:
                override = f"{group}={option}"
                cfg = OmegaConf.to_container(compose("plan", [override]))
                assert sorted(cfg) == sorted(CONFIG_KEYS)
                specs = tables_from_list(cfg["tables"])
                topology = Topology.from_dict(cfg["topology"])
                Constraints.from_dict(cfg["constraints"], [s.name for s in specs], topology.world_size)
                assert planner_options(cfg["planner"])["time_budget_s"] > 0
                if option in documented[group]:
                    assert topology.world_size == world_size.get(override, 8), override
