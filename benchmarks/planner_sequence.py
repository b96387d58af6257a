"""Gap to the bound on sequence-heavy sets: 20% sequence tables on 64 ranks (issue 13, item 4).

    PYTHONPATH=. .venv/bin/python benchmarks/planner_sequence.py > rows.txt

`python -m embshard.workloads --num-tables N --seed S --sequence-fraction 0.2` for N in 50,
150, 400 and seeds 0-2, on 64 ranks (8 per host, cuda) with 16 GiB and batch 128 per rank,
and with the shipped gpu topology's 80 GiB and batch 512; planning budget --budget-s (30 s
by default, so that a loaded machine does not cut the search short). Prints one markdown row
per set: objective, bound, gap and the search's method, for whichever embshard PYTHONPATH imports
(run it once per checkout to compare).
"""

from __future__ import annotations

import argparse

from embshard.planner import plan
from embshard.topology import Topology
from embshard.workloads import generate_tables

TOPOLOGIES = (("16 GiB, batch 128", 16.0, 128), ("80 GiB, batch 512", 80.0, 512))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=30.0)
    args = parser.parse_args()
    print("| topology | tables | seed | objective ms | bound ms | gap | method |\n|---|---|---|---|---|---|---|")
    for label, hbm_gib, batch in TOPOLOGIES:
        for n in (50, 150, 400):
            for seed in (0, 1, 2):
                specs = generate_tables(n, seed=seed, sequence_fraction=0.2)
                topo = Topology(world_size=64, local_world_size=8, hbm_gib=hbm_gib, batch_size_per_rank=batch, device="cuda")
                p = plan(specs, topo, time_budget_s=args.budget_s)
                print(f"| {label} | {n} | {seed} | {p.max_rank_ms:.4f} | {p.lower_bound_ms:.4f} | {100 * p.gap:.1f}% | {p.search['method']} |",
                      flush=True)


if __name__ == "__main__":
    main()
