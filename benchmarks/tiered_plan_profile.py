"""Where embshard's planning time goes on criteo_tb_measured tiered (tiered_vs_torchrec.py's first case).

    .venv/bin/python benchmarks/tiered_plan_profile.py            # 1 warm-up + 5 timed plans, cProfile top 30
    .venv/bin/python benchmarks/tiered_plan_profile.py --runs 20 --no-profile
    .venv/bin/python benchmarks/tiered_plan_profile.py --cold --runs 7     # a fresh process per plan, as the benchmark

Loads the case as tiered_vs_torchrec.py's `cases()` does and plans it as `run_embshard` does (time budget
10 s, not torchrec_compatible); prints each plan's CPU seconds (time.process_time around the call, as the
benchmark measures it), their median, the plan's objective and stages, then cProfile's 30 costliest functions
by cumulative and by own time over 3 more plans. On a shared machine compare versions back to back in one run.
--cold measures what tiered_vs_torchrec.py measures: each run a fresh subprocess that imports the benchmark's modules
(tiered_vs_torchrec), loads the tables and times its first plan() alone (one-time costs included: first use of
numpy and HiGHS, caches built per process); with the profile, cProfile of one more such first plan.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_vs_torchrec import REPO  # noqa: E402

from embshard.planner import plan  # noqa: E402
from embshard.specs import load_tables_file  # noqa: E402
from embshard.topology import Topology  # noqa: E402


def case(ddr_gib: float = 64.0):
    """criteo_tb_measured on 8 ranks x 8 GiB of HBM with ddr_gib of host memory each (tiered_vs_torchrec.py's first case)."""
    specs, _ = load_tables_file(REPO / "embshard" / "configs" / "tables" / "criteo_tb_measured.yaml")
    return specs, Topology(world_size=8, local_world_size=8, hbm_gib=8.0, ddr_gib=ddr_gib,
                           batch_size_per_rank=4096)  # the batch of the file's topology (README's dry run)


def print_profile(profile: cProfile.Profile) -> None:
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(key).print_stats(30)
        print(out.getvalue())


def cold_child(profiled: bool, ddr_gib: float = 64.0) -> None:
    """The first plan of a process that imported what the benchmark imports: its CPU s (and objective) as JSON."""
    import tiered_vs_torchrec  # noqa: F401  (the benchmark's imports, before its first plan)
    specs, topo = case(ddr_gib)
    profile = cProfile.Profile() if profiled else None
    if profile:
        profile.enable()
    c0 = time.process_time()
    p = plan(specs, topo, time_budget_s=10.0)
    cpu_s = time.process_time() - c0
    if profile:
        profile.disable()
        print_profile(profile)
    print(json.dumps({"cpu_s": cpu_s, "objective_ms": p.max_rank_ms}))


def cold_plan(ddr_gib: float = 64.0) -> dict:
    """`cold_child` in a fresh process: {"cpu_s", "objective_ms"} of its first plan."""
    out = subprocess.run([sys.executable, __file__, "--cold-child", "--ddr-gib", repr(ddr_gib)], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cold(runs: int, profiled: bool) -> None:
    cpu_s, objectives = [], set()
    for i in range(runs):
        r = cold_plan()
        cpu_s.append(r["cpu_s"])
        objectives.add(r["objective_ms"])
        print(f"cold plan {i}: {r['cpu_s']:.4f} CPU s", flush=True)
    print(f"cold median {statistics.median(cpu_s):.4f} CPU s (min {min(cpu_s):.4f}); objective(s) {sorted(objectives)!r} ms")
    if profiled:
        out = subprocess.run([sys.executable, __file__, "--cold-child", "--profiled"], capture_output=True, text=True, check=True, cwd=REPO)
        print(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed plans after one warm-up (--cold: fresh processes)")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile tables")
    parser.add_argument("--cold", action="store_true", help="each run the first plan of a fresh process")
    parser.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ddr-gib", type=float, default=64.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cold_child:
        return cold_child(args.profiled, args.ddr_gib)
    if args.cold:
        return cold(args.runs, not args.no_profile)
    specs, topo = case()
    plan(specs, topo, time_budget_s=10.0)
    cpu_s = []
    for i in range(args.runs):
        c0 = time.process_time()
        p = plan(specs, topo, time_budget_s=10.0)
        cpu_s.append(time.process_time() - c0)
        print(f"plan {i}: {cpu_s[-1]:.4f} CPU s")
    print(f"median {statistics.median(cpu_s):.4f} CPU s; objective {p.max_rank_ms!r} ms, bound {p.lower_bound_ms:.6f} ms; "
          f"{p.search['method']}; stages (wall s) {p.search['stages_s']}")
    if not args.no_profile:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(3):
            plan(specs, topo, time_budget_s=10.0)
        profile.disable()
        print_profile(profile)


if __name__ == "__main__":
    main()
