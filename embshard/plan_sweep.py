"""What-if sweeps of embshard-plan: one summary line per run and a table comparing the runs.

    embshard-plan --multirun tables=dlrm_856 topology.world_size=256,512,1024 topology.hbm_gib=16,32

Hydra runs the jobs one after another; each writes its plan to ``SWEEP_DIR/N/plan.json``
(Hydra's ``hydra.sweep.dir``, ``multirun/DATE/TIME`` by default, and job number N), prints one
line, and adds its row to ``SWEEP_DIR/sweep.csv`` and ``SWEEP_DIR/sweep.md`` (rewritten after
every job, so the table is whole whenever the sweep stops). A run whose tables do not fit is
a row saying so; the sweep goes on.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Sequence

from embshard.planner.plan import ShardingPlan
from embshard.planner.report import percent
from embshard.topology import GIB

COLUMNS = ("job", "overrides", "world_size", "hbm_gib", "objective_ms", "lower_bound_ms", "gap", "max_memory_gib",
           "memory_cap_gib", "planning_s", "method", "plan")
CSV_NAME, MD_NAME = "sweep.csv", "sweep.md"


def plan_row(job: int, overrides: Sequence[str], plan: ShardingPlan, planning_s: float, plan_path: Path) -> dict[str, Any]:
    topo = plan.topology
    return {"job": job, "overrides": " ".join(overrides), "world_size": topo.world_size, "hbm_gib": topo.hbm_gib,
            "objective_ms": round(plan.max_rank_ms, 6), "lower_bound_ms": round(plan.lower_bound_ms, 6),
            "gap": round(plan.gap, 6), "max_memory_gib": round(max(r.storage.total_bytes for r in plan.ranks) / GIB, 4),
            "memory_cap_gib": round(topo.shard_memory_cap_bytes / GIB, 4), "planning_s": round(planning_s, 3),
            "method": plan.search.get("method", ""), "plan": str(plan_path)}


def infeasible_row(job: int, overrides: Sequence[str], world_size: int, hbm_gib: float, message: str) -> dict[str, Any]:
    """A run whose tables do not fit: its method says so, in the message's first clause."""
    reason = message.removeprefix("infeasible: ").split(" (")[0]
    return {**{c: "" for c in COLUMNS}, "job": job, "overrides": " ".join(overrides), "world_size": world_size,
            "hbm_gib": hbm_gib, "method": f"infeasible: {reason}"}


def summary_line(row: dict[str, Any]) -> str:
    """'job 2 [topology.world_size=512 ...]: objective 1.234 ms, bound ..., gap ..., memory ..., planning ... s'."""
    head = f"job {row['job']} [{row['overrides']}]"
    if row["objective_ms"] == "":
        return f"{head}: {row['method']}"
    return (f"{head}: objective {row['objective_ms']:.3f} ms, bound {row['lower_bound_ms']:.3f} ms, gap {percent(row['gap'])}, "
            f"memory max {row['max_memory_gib']:.2f} of {row['memory_cap_gib']:.2f} GiB, planning {row['planning_s']:.2f} s")


def add_row(sweep_dir: Path, row: dict[str, Any]) -> Path:
    """Append `row` to sweep.csv and rewrite sweep.md from it; returns the markdown path."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / CSV_NAME
    rows = []
    if path.exists():
        with path.open(newline="") as f:
            rows = [r for r in csv.DictReader(f) if r["job"] != str(row["job"])]
    rows.append({c: row[c] for c in COLUMNS})
    rows.sort(key=lambda r: int(r["job"]))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    md = sweep_dir / MD_NAME
    shown = [c for c in COLUMNS if c != "plan"]
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(str(r[c]).replace("|", "/") for c in shown) + " |" for r in rows]
    md.write_text("\n".join(lines) + "\n")
    return md
