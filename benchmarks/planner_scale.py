"""How embshard-plan scales with tables x ranks: before (a base commit) and after (this checkout), side by side.

    .venv/bin/python benchmarks/planner_scale.py --markdown benchmarks/results/planner_scale.md
    .venv/bin/python benchmarks/planner_scale.py --sizes 150x8,1000x256 --torchrec --torchrec-limit-s 600

Cases: `python -m embshard.workloads --num-tables N --sequence-fraction 0.1` (seed 0) on W
ranks, 8 per host, 16 GiB per rank, batch 128 per rank, cuda defaults (SIZES: 150 x 8 up
to 5,000 x 1,024; `--huge` adds 10,000 x 2,048). Each case runs the whole `embshard-plan`
process (imports, Hydra, planning, report, plan.json and chart) in a subprocess, once with
the base commit (--base, default d71f317, checked out with `git worktree` into a temporary
folder) and once with this checkout; it records wall and CPU time of the process (os.wait4, from a small launcher: LAUNCHER),
its peak RSS, the planning time the plan reports (search.wall_s), the plan file's size and
the objective, bound and gap. `--torchrec` also runs TorchRec's EmbeddingShardingPlanner
(benchmarks/planner_vs_torchrec.py's subprocess, killed after --torchrec-limit-s, default 10
min) on each case: its wall time, its plan's objective under embshard's model with embshard's
bound and gap, or "did not finish in 10 min". Sizes run in ascending order (tables x ranks), and
once TorchRec misses the cap at one size the larger ones are not started ("not run: TorchRec
exceeded the cap at a smaller size"), so the TorchRec side takes at most the time of the sizes it
finishes plus one cap (here: 150 x 8 about 70 s, 500 x 64 minutes, 1,000 x 256 the cap).
Without --torchrec the default sizes take about 3 minutes on a quiet 2-core machine.

Writes the markdown table (machine, date, commits, load average before and after), a log-log
PNG of process CPU time and peak RSS against tables x ranks with fitted exponents (beside
the markdown, same name .png), the exponents of planning time and plan size too (the process
times include about 2.5 s of imports; planning time is capped by the budget), and prints progress.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sections import commit_label, load_average

REPO = Path(__file__).resolve().parent.parent
SIZES = ((150, 8), (500, 64), (1000, 256), (2000, 512), (5000, 1024))
HUGE = ((10000, 2048),)
BASE = "d71f317"
TOPOLOGY = ["topology.local_world_size=8", "topology.hbm_gib=16", "topology.batch_size_per_rank=128", "topology.device=cuda"]
SEQUENCE_FRACTION = 0.1
# Starts the measured process and writes its CPU time and peak RSS. It runs from a small interpreter because
# Linux keeps the RSS high-water mark of the memory a child is forked with in its ru_maxrss across exec:
# forked from this process (hundreds of MiB once TorchRec's planner is imported for --torchrec) every case
# would report at least this process's RSS.
LAUNCHER = """import json, os, subprocess, sys
proc = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(proc.pid, 0)
with open(sys.argv[1], "w") as f:
    json.dump({"cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_kib": usage.ru_maxrss}, f)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_case(checkout: Path, config_dir: Path, name: str, world_size: int, out_dir: Path, budget_s: float) -> dict:
    """The whole embshard-plan process of `checkout` on one case: its times, peak RSS and plan."""
    out = out_dir / "plan.json"
    # python -m: the venv's console script imports this checkout's entry point (embshard.scripts), which the base lacks
    cmd = [sys.executable, "-m", "embshard.plan_cli", "--config-dir", str(config_dir), f"tables={name}",
           f"topology.world_size={world_size}", *TOPOLOGY, f"planner.time_budget_s={budget_s:g}", f"out={out}"]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    log = out_dir / "stdout.txt"
    usage_file = out_dir / "usage.json"
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run([sys.executable, "-I", "-S", "-c", LAUNCHER, str(usage_file), *cmd],
                            stdout=f, stderr=subprocess.STDOUT, env=env, cwd=out_dir).returncode
    wall_s = time.perf_counter() - t0
    usage = json.loads(usage_file.read_text())
    row = {"rc": rc, "process_wall_s": wall_s, "process_cpu_s": usage["cpu_s"], "peak_rss_mib": usage["maxrss_kib"] / 1024}
    if rc != 0 or not out.exists():
        row["error"] = log.read_text().strip().splitlines()[-1:] or ["no output"]
        return row
    raw = json.loads(out.read_text())
    search = raw.get("search", {})
    return {**row, "plan_mib": out.stat().st_size / 2**20, "planning_s": search.get("wall_s"), "objective_ms": raw["objective_ms"],
            "bound_ms": raw["lower_bound_ms"], "gap": raw["gap"], "method": search.get("method", "")}


def run_torchrec_case(config_dir: Path, name: str, world_size: int, limit_s: float) -> dict:
    """TorchRec's EmbeddingShardingPlanner on one case, in a subprocess killed after limit_s
    (benchmarks/planner_vs_torchrec.py's child, its own timeout_seconds at 80% of it): the
    subprocess's wall time, the planner's own time, and its plan scored by embshard's model
    (objective, embshard's bound and gap), or why there is none."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from planner_vs_torchrec import run_torchrec  # noqa: E402 (a sibling script)

    from embshard.planner.plan import ShardingPlan
    from embshard.specs import load_tables_file
    from embshard.topology import Topology

    specs, _ = load_tables_file(config_dir / "tables" / f"{name}.yaml")
    topo = Topology(world_size=world_size, local_world_size=8, hbm_gib=16, batch_size_per_rank=128, device="cuda")
    t0 = time.perf_counter()
    result = run_torchrec(specs, topo, limit_s, int(limit_s * 0.8))
    row = {"process_wall_s": time.perf_counter() - t0}
    if result["status"] == "timeout":
        return {**row, "status": f"did not finish in {limit_s / 60:g} min", "timed_out": True}
    if result["status"] != "ok":
        return {**row, "status": f"failed: {result.get('detail', result['status'])}"}
    plan = ShardingPlan.from_dict(result["plan"])
    return {**row, "status": f"ok ({result['num_proposals']} proposals, TorchRec's own rating {result['torchrec_rating_ms']:.4f} ms)",
            "planning_s": result["wall_s"], "objective_ms": plan.max_rank_ms, "bound_ms": plan.lower_bound_ms, "gap": plan.gap}


def case_sizes(spec: str | None, huge: bool) -> list[tuple[int, int]]:
    """(tables, ranks) from 'TABLESxRANKS,...' (None: SIZES; huge adds HUGE), smallest tables x ranks first
    (TorchRec stops at the first size it cannot finish)."""
    sizes = [tuple(int(v) for v in s.split("x")) for s in spec.split(",")] if spec else list(SIZES)
    return sorted(sizes + (list(HUGE) if huge else []), key=lambda nw: (nw[0] * nw[1], nw))


NOT_RUN = "not run: TorchRec exceeded the cap at a smaller size"


def torchrec_case(config_dir: Path, name: str, world_size: int, limit_s: float, done: list[dict]) -> dict:
    """`run_torchrec_case`, unless TorchRec missed its cap on a case of `done` (the smaller sizes)."""
    if any(r.get("torchrec", {}).get("timed_out") or r.get("torchrec", {}).get("status") == NOT_RUN for r in done):
        return {"status": NOT_RUN}
    return run_torchrec_case(config_dir, name, world_size, limit_s)


def fit_exponent(x: list[float], y: list[float]) -> float | None:
    """Slope of log y against log x (cost ~ size^slope), None with fewer than two points."""
    pts = [(a, b) for a, b in zip(x, y) if a and b]
    if len(pts) < 2:
        return None
    return float(np.polyfit(np.log([a for a, _ in pts]), np.log([b for _, b in pts]), 1)[0])


def chart(rows: list[dict], path: Path) -> dict[str, float | None]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fits = {}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "process_cpu_s", "process CPU time (s)"), (axes[1], "peak_rss_mib", "peak RSS (MiB)")):
        for side, style in (("before", "o--"), ("after", "s-")):
            pts = [(r["tables"] * r["ranks"], r[side].get(key)) for r in rows if r[side].get("rc") == 0]
            if not pts:
                continue
            x, y = zip(*pts)
            k = fit_exponent(list(x), list(y))
            fits[f"{side} {key}"] = k
            ax.plot(x, y, style, label=f"{side} (~size^{k:.2f})" if k is not None else side)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # on a narrow range the labels of 2x, 3x, ... overlapped
        ax.set_xlabel("tables x ranks")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    for key in ("planning_s", "plan_mib"):  # fitted, not drawn: planning time is capped by the budget
        for side in ("before", "after"):
            pts = [(r["tables"] * r["ranks"], r[side].get(key)) for r in rows if r[side].get("rc") == 0]
            fits[f"{side} {key}"] = fit_exponent([x for x, _ in pts], [y for _, y in pts])
    fig.suptitle("embshard-plan, whole process: before vs after")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fits


def cell(value, spec: str) -> str:
    return "n/a" if value is None or value == "" else format(value, spec)


def markdown(rows: list[dict], meta: dict, fits: dict, png: Path) -> str:
    lines = [
        "# Planner scale: whole embshard-plan process, before vs after", "",
        f"Command: `{meta['command']}`", "",
        f"- machine: {meta['machine']}", f"- date: {meta['date']}",
        f"- before: {meta['base']}; after: {meta['head']}",
        f"- load average (1/5/15 min) before: {meta['load_before']}, after: {meta['load_after']}",
        f"- cases: `python -m embshard.workloads --num-tables N --sequence-fraction {SEQUENCE_FRACTION}` on W ranks "
        f"(8 per host, 16 GiB, batch 128 per rank, cuda); planning budget {meta['budget_s']:g} s",
        *([f"- TorchRec: its EmbeddingShardingPlanner on each size in ascending order, killed after {meta['torchrec_limit_s'] / 60:g} min; "
           "once it misses that cap, larger sizes are not started"] if any("torchrec" in r for r in rows) else []), "",
        "| tables x ranks | side | process wall s | process CPU s | planning s | peak RSS MiB | plan MiB | objective ms | bound ms | gap | method |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        for side in ("before", "after"):
            x = r[side]
            if x.get("rc") != 0:
                lines.append(f"| {r['tables']} x {r['ranks']} | {side} | {cell(x.get('process_wall_s'), '.1f')} | "
                             f"{cell(x.get('process_cpu_s'), '.1f')} | | {cell(x.get('peak_rss_mib'), '.0f')} | | | | | failed: {x.get('error')} |")
                continue
            lines.append(f"| {r['tables']} x {r['ranks']} | {side} | {x['process_wall_s']:.1f} | {x['process_cpu_s']:.1f} | "
                         f"{cell(x['planning_s'], '.2f')} | {x['peak_rss_mib']:.0f} | {x['plan_mib']:.2f} | {x['objective_ms']:.4f} | "
                         f"{x['bound_ms']:.4f} | {100 * x['gap']:.1f}% | {x['method']} |")
        if "torchrec" in r:
            t = r["torchrec"]
            gap = f"{100 * t['gap']:.1f}%" if "gap" in t else ""
            lines.append(f"| {r['tables']} x {r['ranks']} | TorchRec planner | {cell(t.get('process_wall_s'), '.1f')} | | "
                         f"{cell(t.get('planning_s'), '.2f')} | | | {cell(t.get('objective_ms'), '.4f')} | {cell(t.get('bound_ms'), '.4f')} | "
                         f"{gap} | {t['status']} |")
    lines += ["", f"![time and memory vs size]({png.name})", "",
              "Fitted exponents (cost ~ (tables x ranks)^k, least squares on log-log): "
              + ", ".join(f"{k}: {cell(v, '.2f')}" for k, v in fits.items()), ""]
    return "\n".join(lines)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", help="comma-separated TABLESxRANKS (default: 150x8 ... 5000x1024)")
    parser.add_argument("--huge", action="store_true", help="also 10000x2048")
    parser.add_argument("--base", default=BASE, help="the 'before' commit")
    parser.add_argument("--budget-s", type=float, default=10.0, help="planner.time_budget_s for both sides")
    parser.add_argument("--torchrec", action="store_true", help="also run TorchRec's planner (slow)")
    parser.add_argument("--torchrec-limit-s", type=float, default=600.0)
    parser.add_argument("--markdown", type=Path, default=REPO / "benchmarks" / "results" / "planner_scale.md")
    args = parser.parse_args(argv)
    sizes = case_sizes(args.sizes, args.huge)
    from embshard.machine import cpu_model
    from embshard.workloads import generate_tables, tables_yaml

    meta = {"command": "python benchmarks/planner_scale.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, Python {platform.python_version()}",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "base": f"{args.base} ({git('rev-parse', '--short', args.base)})",
            "head": commit_label(), "load_before": load_average(), "budget_s": args.budget_s,
            "torchrec_limit_s": args.torchrec_limit_s}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        git("worktree", "add", "--detach", str(base), args.base)
        try:
            config_dir, before_dir = tmp / "configs", tmp / "configs_before"
            (config_dir / "tables").mkdir(parents=True)
            (before_dir / "tables").mkdir(parents=True)
            for n, w in sizes:
                name = f"scale_{n}"
                tables = generate_tables(n, seed=0, sequence_fraction=SEQUENCE_FRACTION)
                command = f"python -m embshard.workloads --num-tables {n} --seed 0 --sequence-fraction {SEQUENCE_FRACTION}"
                # each side reads the file its own generator writes: mappings before, text from 1,000 tables after
                for side_dir, as_text in ((before_dir, False), (config_dir, None)):
                    path = side_dir / "tables" / f"{name}.yaml"
                    if not path.exists():
                        path.write_text(tables_yaml(tables, command, as_text))
                row = {"tables": n, "ranks": w}
                for side, checkout, tables_dir in (("before", base, before_dir), ("after", REPO, config_dir)):
                    out_dir = tmp / f"{side}_{n}x{w}"
                    out_dir.mkdir()
                    print(f"{n} tables x {w} ranks, {side} ...", end=" ", flush=True)
                    row[side] = run_case(checkout, tables_dir, name, w, out_dir, args.budget_s)
                    x = row[side]
                    print(f"process {x['process_wall_s']:.1f} s wall, {x['process_cpu_s']:.1f} s CPU, {x['peak_rss_mib']:.0f} MiB"
                          + (f", objective {x['objective_ms']:.4f} ms, gap {100 * x['gap']:.1f}%, plan {x['plan_mib']:.1f} MiB"
                             if x["rc"] == 0 else f", failed: {x.get('error')}"), flush=True)
                if args.torchrec:
                    print(f"{n} tables x {w} ranks, TorchRec ...", end=" ", flush=True)
                    row["torchrec"] = torchrec_case(config_dir, name, w, args.torchrec_limit_s, rows)
                    print(row["torchrec"], flush=True)
                rows.append(row)
        finally:
            git("worktree", "remove", "--force", str(base))
    meta["load_after"] = load_average()
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    png = args.markdown.with_suffix(".png")
    fits = chart(rows, png)
    args.markdown.write_text(markdown(rows, meta, fits, png))
    print(f"wrote {args.markdown} and {png}")


if __name__ == "__main__":
    main()
