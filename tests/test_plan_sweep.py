"""embshard-plan --multirun: one line per run and a table comparing the runs (a subprocess, as a user runs it)."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from embshard.planner.plan import ShardingPlan

CLI = str(Path(sys.executable).parent / "embshard-plan")


def test_multirun_prints_a_line_per_run_and_writes_the_table(tmp_path):
    args = ["--multirun", "tables=criteo_tb", "topology.world_size=8,16", "topology.hbm_gib=16,0.3",
            "planner.time_budget_s=0.5", "hydra.sweep.dir=sweep"]
    proc = subprocess.run([CLI, *args], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("job ")]
    assert len(lines) == 4
    with (tmp_path / "sweep" / "sweep.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["world_size"], r["hbm_gib"]) for r in rows] == [
        ("0", "8", "16.0"), ("1", "8", "0.3"), ("2", "16", "16.0"), ("3", "16", "0.3")]
    for r, line in zip(rows, lines):
        assert line.startswith(f"job {r['job']} [tables=criteo_tb topology.world_size={r['world_size']} topology.hbm_gib=")
        if r["hbm_gib"] == "0.3":  # criteo_tb does not fit 0.3 GiB ranks: a row says so, the sweep goes on
            assert r["objective_ms"] == "" and r["method"].startswith("infeasible: 5 table(s) cannot fit the 0.17 GiB")
            assert "infeasible: 5 table(s)" in line and not (tmp_path / "sweep" / r["job"] / "plan.json").exists()
            continue
        plan = ShardingPlan.load(tmp_path / "sweep" / r["job"] / "plan.json")
        assert plan.topology.world_size == int(r["world_size"])
        assert float(r["objective_ms"]) == round(plan.max_rank_ms, 6)
        assert float(r["lower_bound_ms"]) == round(plan.lower_bound_ms, 6) and float(r["gap"]) == round(plan.gap, 6)
        assert float(r["max_memory_gib"]) <= float(r["memory_cap_gib"]) and float(r["planning_s"]) > 0
        assert f"objective {plan.max_rank_ms:.3f} ms" in line and "planning" in line
    md = (tmp_path / "sweep" / "sweep.md").read_text().splitlines()
    assert md[0].startswith("| job | overrides | world_size | hbm_gib | objective_ms | lower_bound_ms | gap |") and len(md) == 6
    assert not (tmp_path / "outputs").exists()  # the runs' plans went to the sweep folder
