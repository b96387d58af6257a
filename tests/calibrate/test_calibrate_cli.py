"""embshard-calibrate and embshard-plan measure=true end to end, on a tiny grid (real gloo ranks)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from embshard.topology import PHASE_FACTORS, Topology

BIN = Path(sys.executable).parent
TINY = ["kernels.dims=[16]", "kernels.rows=[1000]", "kernels.batches=[64]", "kernels.poolings=[2]", "kernels.sequence=false",
        "kernels.dp_max_rows=1000", "kernels.steps=1", "kernels.warmup=1", "collectives.world_sizes=[2]",
        "collectives.sizes_bytes=[1000,100000]", "collectives.reps=1", "collectives.warmup=0", "plans.world_sizes=[2]",
        "plans.num_plans=1", "plans.num_tables=3", "plans.max_rows=2000", "plans.steps=1", "plans.warmup=1", "plans.host_reduce_plans=0", "plans.dp_hier_plans=0", "timeout_s=240"]
TABLES = """# @package _global_
tables:
  - {name: a, num_embeddings: 3000, embedding_dim: 16, pooling_factor: 4.0}
  - {name: b, num_embeddings: 500, embedding_dim: 8, pooling_factor: 2.0}
"""


def cli(name: str, *args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / name), *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibrate")
    (root / "tables").mkdir()
    (root / "tables" / "two.yaml").write_text(TABLES)
    run = cli("embshard-calibrate", "profile=tiny_test", f"out_dir={root / 'topology'}", f"data_out={root / 'data.json'}", *TINY)
    return root, run


def test_calibrate_writes_a_profile_the_planner_reads(calibrated):
    root, run = calibrated
    assert run.returncode == 0, run.stderr
    raw = yaml.safe_load((root / "topology" / "tiny_test.yaml").read_text())
    topo = Topology.from_dict(raw)
    assert topo.device == "cpu" and topo.full_duplex is False and topo.world_size == 2
    assert topo.intra_host_gb_per_s > 0 and topo.hbm_gb_per_s > 0
    assert all(getattr(topo, f) > 0 for f in PHASE_FACTORS)
    data = json.loads((root / "data.json").read_text())
    assert [(k["kind"], k["rows"], k["dim"], k["features"]) for k in data["kernels"]] == [
        ("fbgemm", 1000, 16, 1), ("fbgemm", 1000, 16, 4), ("dp", 1000, 16, 1), ("allreduce", 1000, 16, 1)]  # 4: a shared table
    assert data["kernels"][0]["cpu_lookup_bwd_ms"] > 0 and data["kernels"][1]["cpu_lookup_bwd_ms"] > 0
    assert data["kernels"][3]["cpu_dp_allreduce_ms"] >= 0
    assert data["kernels"][3]["cpu_lookup_bwd_ms"] > 0 and "dp_dense_gb_per_s" in raw  # the all-reduce mode's dense work, fitted
    assert sorted({(c["op"], c["bytes"], c["rank"]) for c in data["collectives"]}) == \
        [(op, b, r) for op in ("all_reduce", "all_to_all") for b in (1000, 100000) for r in (0, 1)]
    assert all(c["cpu_ms"] > 0 for c in data["collectives"])
    (entry,) = data["plans"]
    assert len(entry["cpu_ms"]) == 2
    for rank in entry["cpu_ms"]:
        assert rank["total_ms"] == pytest.approx(sum(v for k, v in rank.items() if k != "total_ms"), rel=1e-6)
        assert min(rank.values()) >= 0 and rank["input_dist_ms"] > 0
    assert "fit plans: median error" in run.stdout
    assert f"wrote {root}/topology/tiny_test.yaml; plan with: embshard-plan --config-dir {root} topology=tiny_test" in run.stdout


def test_plan_measure_prints_measured_next_to_predicted(calibrated):
    root, _ = calibrated
    run = cli("embshard-plan", "--config-dir", str(root), "tables=two", "topology=tiny_test", "planner.time_budget_s=0.5",
              f"out={root / 'plan.json'}", "measure=true", "measure_steps=1")
    assert run.returncode == 0, run.stderr
    assert "predicted / measured ms per rank and phase" in run.stdout
    assert "slowest rank: predicted" in run.stdout and "wall clock:" in run.stdout


def test_bad_input_exits_2_with_one_line():
    run = cli("embshard-calibrate", "profile=cpu", timeout=120)
    assert run.returncode == 2
    assert run.stderr == "embshard-calibrate: error: profile: 'cpu' is a shipped datasheet topology; choose another name, e.g. cpu_measured\n"


@pytest.mark.parametrize("override,needle", [
    ({"kernels": {"dims": [0]}}, "kernels.dims: must be a non-empty list of positive numbers, got [0]"),
    ({"plans": {"world_sizes": [1]}}, "plans.world_sizes: ranks per run must be whole numbers >= 2, got [1]"),
    ({"topology": {"world_size": 3}}, "topology.world_size: 3 is not a multiple of local_world_size 2"),
    ({"collectives": {"reps": 0}}, "collectives.reps: must be a positive integer, got 0"),
    ({"kernels": {"shared_features": -1}}, "kernels.shared_features: must be a non-negative integer, got -1"),
    ({"timeout_s": -1}, "timeout_s: must be a positive number of seconds, got -1"),
])
def test_bad_config_names_the_key(override, needle):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from embshard.calibrate.calibrate import validate, read_data
    from embshard.cli import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = OmegaConf.to_container(compose("calibrate"), resolve=True)
    validate(cfg)  # the shipped config is valid
    for key, value in override.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    with pytest.raises(ValueError) as e:
        validate(cfg)
    assert needle in str(e.value)
    with pytest.raises(ValueError, match="from_data=/nonexistent/data.json: cannot read"):
        read_data("/nonexistent/data.json")


def test_measure_option_is_validated():
    run = cli("embshard-plan", "measure_steps=0", timeout=120)
    assert run.returncode == 2 and "measure_steps: must be a positive integer, got 0" in run.stderr


def test_profile_goes_to_a_user_folder_not_the_package(tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from embshard.calibrate.calibrate import write_profile
    from embshard.cli import CONFIG_DIR

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = OmegaConf.to_container(compose("calibrate", ["profile=mine"]), resolve=True)
    monkeypatch.chdir(tmp_path)
    assert write_profile("device: cpu\n", cfg) == Path("outputs/calibrate/topology/mine.yaml")
    assert (tmp_path / "outputs/calibrate/topology/mine.yaml").read_text() == "device: cpu\n"
    assert not (Path(CONFIG_DIR) / "topology" / "mine.yaml").exists()
