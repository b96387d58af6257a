"""Where embshard's planning time goes on criteo_tb_measured tiered (tiered_vs_torchrec.py's first case).

    .venv/bin/python benchmarks/tiered_plan_profile.py            # 1 warm-up + 5 timed plans, cProfile top 30
    .venv/bin/python benchmarks/tiered_plan_profile.py --runs 20 --no-profile

Loads the case as tiered_vs_torchrec.py's `cases()` does and plans it as `run_embshard` does (time budget
10 s, not torchrec_compatible); prints each plan's CPU seconds (time.process_time around the call, as the
benchmark measures it), their median, the plan's objective and stages, then cProfile's 30 costliest functions
by cumulative and by own time over 3 more plans. On a shared machine compare versions back to back in one run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from planner_vs_torchrec import REPO  # noqa: E402

from embshard.planner import plan  # noqa: E402
from embshard.specs import load_tables_file  # noqa: E402
from embshard.topology import Topology  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="timed plans after one warm-up")
    parser.add_argument("--no-profile", action="store_true", help="skip the cProfile tables")
    args = parser.parse_args()
    specs, _ = load_tables_file(REPO / "embshard" / "configs" / "tables" / "criteo_tb_measured.yaml")
    topo = Topology(world_size=8, local_world_size=8, hbm_gib=8.0, ddr_gib=64.0, batch_size_per_rank=4096)
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
        for key in ("cumulative", "tottime"):
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats(key).print_stats(30)
            print(out.getvalue())


if __name__ == "__main__":
    main()
