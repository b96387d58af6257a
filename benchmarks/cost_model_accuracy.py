"""How well does the planner's cost model predict measured per-rank step time, before and after calibration?

    .venv/bin/python benchmarks/cost_model_accuracy.py --profile cpu_gloo_measured

20 random plans (embshard.calibrate.synthetic.random_plan: every table gets a random
runnable layout: table_wise, row_wise, column_wise or data_parallel on random ranks) of
generated workloads (bench_tables: generate_tables(12, seed) with rows capped at 200,000 and
pooling factors at 40; seeds 5000-5019, disjoint from the calibration's) run on local gloo
ranks, 10 plans on 2 ranks and 10 on 4, batch 512 per rank. Each rank's step (forward +
backward with the fused optimizer) is measured as the CPU time of its process, median of
--steps steps (embshard.calibrate.measure), so 4 ranks on 2 cores are measured per rank;
every plan is measured --rounds times in alternating order and the median counts.

Predictions, both by `embshard.planner.evaluate` (the planner's report and the objective
its search minimises): "before" on the datasheet cpu topology (topology=cpu), "after" on the
calibrated profile (its fitted terms, half-duplex all-to-alls and fixed per-step costs).
Metrics over all per-rank points: Spearman rank correlation and median absolute relative
error; and over the plans' slowest ranks. --from-json re-predicts saved measurements with
the current model and profile. Results go into benchmarks/results/cost_model.md (section between markers)
and --json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from scipy.stats import spearmanr

from embshard.calibrate.measure import measure_rounds
from embshard.calibrate.synthetic import bench_tables, random_plan
from embshard.machine import cpu_model
from embshard.planner import evaluate
from embshard.topology import Topology
from sections import update_section

REPO = Path(__file__).resolve().parent.parent
BATCH = 512
NUM_TABLES = 12
SEED0 = 5000
TITLE = "# Cost model: calibration, accuracy and measured plans"  # of benchmarks/results/cost_model.md


def profile_topology(name: str, world_size: int) -> Topology:
    raw = yaml.safe_load((REPO / "embshard" / "configs" / "topology" / f"{name}.yaml").read_text())
    return Topology.from_dict({**raw, "world_size": world_size, "local_world_size": world_size, "batch_size_per_rank": BATCH})


def datasheet_topology(world_size: int) -> Topology:
    return Topology(world_size=world_size, local_world_size=world_size, hbm_gib=16, batch_size_per_rank=BATCH, device="cpu")


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def metrics(pred: list[float], meas: list[float]) -> dict[str, float]:
    p, m = np.array(pred), np.array(meas)
    return {"spearman": float(spearmanr(p, m)[0]), "median_abs_err": float(np.median(np.abs(p - m) / m)),
            "mean_signed_err": float(np.mean((p - m) / m)), "n": len(p)}


def bench_plan(i: int, world_size: int):
    return random_plan(bench_tables(NUM_TABLES, SEED0 + i), datasheet_topology(world_size), SEED0 + i)


def groups(num_plans: int) -> tuple[tuple[int, range], ...]:
    return ((2, range(0, num_plans // 2)), (4, range(num_plans // 2, num_plans)))


def run(args: argparse.Namespace) -> dict:
    t0 = time.time()
    load_start = os.getloadavg()
    rows = []
    for W, indices in groups(args.num_plans):
        plans = [bench_plan(i, W) for i in indices]
        measured = measure_rounds(plans, args.rounds, steps=args.steps, warmup=args.warmup, log=lambda m: print(m, flush=True))
        for i, p, rounds in zip(indices, plans, measured):
            layout: dict[str, int] = {}
            for t in p.tables:
                layout[t.sharding_type.value] = layout.get(t.sharding_type.value, 0) + 1
            for r in range(W):
                per_round = [m.ranks[r] for m in rounds]
                med = statistics.median
                rows.append({"plan": i, "world_size": W, "rank": r, "layout": layout,
                             "measured_ms": med([x.cpu_ms["total_ms"] for x in per_round]),
                             "measured_rounds_ms": [x.cpu_ms["total_ms"] for x in per_round],
                             "measured_phases_ms": {k: med([x.cpu_ms[k] for x in per_round]) for k in per_round[0].cpu_ms},
                             "wall_ms": med([x.wall_ms["total_ms"] for x in per_round]),
                             "step_wall_ms": med([m.step_wall_ms for m in rounds])})
    result = {"rows": rows, "profile": args.profile, "date": today(), "steps": args.steps, "rounds": args.rounds, "load_start": load_start, "load_end": os.getloadavg(),
              "seconds": time.time() - t0, "cpu": cpu_model(), "cores": os.cpu_count()}
    predict(result, args.profile)
    return result


def predict(result: dict, profile: str) -> None:
    """Predictions for every measured rank (plans are regenerated from their seeds)."""
    plans = {(W, i): bench_plan(i, W) for W, i in {(r["world_size"], r["plan"]) for r in result["rows"]}}
    cache = {}
    for key, p in plans.items():
        W = key[0]
        after_topo = profile_topology(profile, W)
        cache[key] = (evaluate(p.specs, datasheet_topology(W), p.tables), evaluate(p.specs, after_topo, p.tables))
    for row in result["rows"]:
        before, after = cache[(row["world_size"], row["plan"])]
        r = row["rank"]
        row.pop("after_evaluate_ms", None)  # an earlier version's second "after" model
        row.update(before_ms=before.ranks[r].perf.total_ms, after_ms=after.ranks[r].perf.total_ms,
                   after_phases_ms=after.ranks[r].perf.to_dict())
    result["profile"] = profile
    result["metrics"] = summarize(result["rows"])


def summarize(rows: list[dict]) -> dict:
    out = {}
    for key in ("before_ms", "after_ms"):
        per_rank = {"all": metrics([r[key] for r in rows], [r["measured_ms"] for r in rows])}
        for W in (2, 4):
            sel = [r for r in rows if r["world_size"] == W]
            per_rank[f"W={W}"] = metrics([r[key] for r in sel], [r["measured_ms"] for r in sel])
        plans = sorted({(r["world_size"], r["plan"]) for r in rows})
        slow_pred = [max(r[key] for r in rows if (r["world_size"], r["plan"]) == k) for k in plans]
        slow_meas = [max(r["measured_ms"] for r in rows if (r["world_size"], r["plan"]) == k) for k in plans]
        per_rank["slowest rank per plan"] = metrics(slow_pred, slow_meas)
        out[key] = per_rank
    return out


def markdown(result: dict, command: str) -> str:
    m = result["metrics"]
    names = {"before_ms": "before: datasheet `topology=cpu`, `evaluate`",
             "after_ms": f"after: `topology={result['profile']}`, `evaluate` (what the search minimises)"}
    lines = [
        "## Cost model accuracy: predicted vs measured per-rank step time", "",
        f"Command: `{command}`. {result['cpu']}, {result['cores']} cores, no GPU; measured {result['date']}; load average {result['load_start'][0]:.1f} at start, "
        f"{result['load_end'][0]:.1f} at end (other engineers' jobs share the machine); {result['seconds']:.0f} s.",
        "",
        f"{len({(r['world_size'], r['plan']) for r in result['rows']})} random plans of generated workloads (12 tables, rows <= 200k, "
        f"pooling <= 40, seeds {SEED0}-{SEED0 + 19}; calibration used other seeds), 10 on 2 ranks and 10 on 4, batch {BATCH} per rank. "
        f"Measured: each rank's CPU time per step (forward + backward + fused update), median of {result['steps']} steps "
        f"(and of {result.get('rounds', 1)} rounds in alternating order); "
        "4 ranks on 2 cores are measured inside each rank, so oversubscription and waiting for peers do not count.",
        "",
        "| prediction | points | Spearman | median abs error | mean signed error |",
        "|---|---|---:|---:|---:|",
    ]
    for key, name in names.items():
        for scope in ("all", "W=2", "W=4", "slowest rank per plan"):
            x = m[key][scope]
            lines.append(f"| {name} | {scope} ({x['n']}) | {x['spearman']:.3f} | {x['median_abs_err']:.1%} | {x['mean_signed_err']:+.1%} |")
    a = m["after_ms"]["all"]
    ok = a["spearman"] >= 0.9 and a["median_abs_err"] <= 0.2
    lines += ["", f"Target after calibration (Spearman >= 0.9, median error <= 20%, all per-rank points): "
              f"{'met' if ok else 'MISSED'} (Spearman {a['spearman']:.3f}, median error {a['median_abs_err']:.1%}).", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu_gloo_measured")
    parser.add_argument("--num-plans", type=int, default=20)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="measure every plan this many times, alternating the order; median")
    parser.add_argument("--json", default="benchmarks/results/cost_model_accuracy.json")
    parser.add_argument("--markdown", default="benchmarks/results/cost_model.md")
    parser.add_argument("--from-json", help="re-summarize a previous --json without measuring")
    args = parser.parse_args()
    if not (REPO / "embshard" / "configs" / "topology" / f"{args.profile}.yaml").exists():
        sys.exit(f"cost_model_accuracy: error: no profile configs/topology/{args.profile}.yaml; run embshard-calibrate profile={args.profile}")
    if args.from_json:  # the same measurements, predictions from the current model and profile
        result = json.loads(Path(args.from_json).read_text())
        predict(result, args.profile)
        Path(args.json).write_text(json.dumps(result, indent=1))
    else:
        result = run(args)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1))
    command = f".venv/bin/python benchmarks/cost_model_accuracy.py --profile {args.profile}"
    text = markdown(result, command)
    update_section(Path(args.markdown), "accuracy", text, TITLE)
    print(text)


if __name__ == "__main__":
    main()
