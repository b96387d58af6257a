"""Measured next to predicted: per-rank time by phase of a plan run on local ranks.

`embshard-plan ... measure=true` calls `measure_report` after planning: the plan runs on
topology.world_size local ranks on the topology's device (cpu: gloo ranks; cuda: nccl
ranks, one GPU each), with synthetic batches drawn from the table specs, batch
topology.batch_size_per_rank per rank, and a table shows, per rank and phase, the predicted
time and the measured time of the rank (CPU time on cpu, wall time after synchronizing on
cuda; see embshard.calibrate.measure), then the totals, the wall-clock step time and how
well the ranks' order matches.
"""

from __future__ import annotations

import os
from typing import Sequence

from rich.console import Console
from rich.table import Table

from embshard.calibrate.device import BACKENDS, local_ranks_available, resolve_device
from embshard.calibrate.measure import PHASES, PlanMeasurement, measure_plans
from embshard.planner.plan import ShardingPlan

SHORT = {"input_dist_ms": "input", "lookup_fwd_ms": "lookup fwd", "output_dist_fwd_ms": "out fwd",
         "output_dist_bwd_ms": "out bwd", "lookup_bwd_ms": "lookup bwd", "dp_allreduce_ms": "dp sync"}
MAX_LOCAL_RANKS = 16


def check_runnable(plan: ShardingPlan) -> None:
    """ValueError unless the plan can run on this machine's local ranks (on its topology's device)."""
    W, device = plan.topology.world_size, plan.topology.device
    if W > MAX_LOCAL_RANKS:
        raise ValueError(f"measure: the plan has {W} ranks; measuring runs every rank as a local process "
                         f"(at most {MAX_LOCAL_RANKS}); plan for fewer ranks, e.g. topology.world_size=4")
    resolve_device(device, "measure: topology.device", "measure here with a cpu topology (topology=cpu, or topology.device=cpu)")
    if not local_ranks_available(device, W):
        raise ValueError(f"measure: the plan has {W} cuda ranks but this machine has fewer GPUs (nccl runs one rank per GPU); "
                         f"plan for fewer ranks, e.g. topology.world_size=1 topology.local_world_size=1")
    if device == "cuda":
        return  # GPU memory: the planner's hbm_gib per rank is the check
    need = sum(r.storage.total_bytes for r in plan.ranks)
    avail = _available_bytes()
    if avail is not None and need > 0.7 * avail:
        raise ValueError(f"measure: the plan's ranks need {need / 2**30:.1f} GiB together but this machine has "
                         f"{avail / 2**30:.1f} GiB available; use smaller tables or fewer ranks")


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    from scipy.stats import spearmanr

    if len(x) < 3 or len(set(x)) < 2 or len(set(y)) < 2:
        return float("nan")
    return float(spearmanr(x, y)[0])


def comparison_table(plan: ShardingPlan, measured: PlanMeasurement) -> Table:
    """Per rank and phase: the plan's predicted ms (its evaluate() report) / measured CPU ms."""
    what = "wall time after cuda synchronize" if plan.topology.device == "cuda" else "CPU time"
    table = Table(title=f"predicted / measured ms per rank and phase (measured: {what} of the rank, median of {measured.steps} steps)")
    table.add_column("rank", justify="right")
    for p in PHASES:
        table.add_column(SHORT[p], justify="right")
    for title in ("total pred", "total meas", "error", "wall"):
        table.add_column(title, justify="right")
    for r, (pred, meas) in enumerate(zip((x.perf for x in plan.ranks), measured.ranks)):
        total = meas.cpu_ms["total_ms"]
        table.add_row(str(r), *(f"{getattr(pred, p):.2f} / {meas.cpu_ms[p]:.2f}" for p in PHASES),
                      f"{pred.total_ms:.2f}", f"{total:.2f}", f"{(pred.total_ms - total) / total:+.0%}", f"{meas.wall_ms['total_ms']:.1f}")
    return table


def summary_lines(plan: ShardingPlan, measured: PlanMeasurement) -> list[str]:
    pred = [r.perf.total_ms for r in plan.ranks]
    meas = [r.cpu_ms["total_ms"] for r in measured.ranks]
    worst_p, worst_m = max(range(len(pred)), key=pred.__getitem__), max(range(len(meas)), key=meas.__getitem__)
    errors = sorted(abs(p - m) / m for p, m in zip(pred, meas))
    return [
        f"slowest rank: predicted {max(pred):.2f} ms (rank {worst_p}), measured {max(meas):.2f} ms "
        f"{'wall' if plan.topology.device == 'cuda' else 'CPU'} (rank {worst_m}); "
        f"median |error| over ranks {errors[len(errors) // 2]:.1%}; rank-order Spearman {spearman(pred, meas):.2f}",
        f"wall clock: {measured.step_wall_ms:.1f} ms per step with all {len(meas)} ranks on {os.cpu_count()} cores "
        f"(load average {os.getloadavg()[0]:.1f}); wall time also counts waiting for peers and sharing cores",
    ]


def measure_report(plan: ShardingPlan, steps: int, console: Console, warmup: int = 3, timeout_s: float = 1800) -> PlanMeasurement:
    """Run the plan on local ranks and print predicted vs measured per rank and phase."""
    check_runnable(plan)
    device = plan.topology.device
    console.print(f"measuring: {plan.topology.world_size} local {BACKENDS[device]} ranks on {device}, {warmup} warm-up + {steps} steps, "
                  f"batch {plan.topology.batch_size_per_rank} per rank", markup=False, highlight=False)
    measured = measure_plans([plan], steps=steps, warmup=warmup, timeout_s=timeout_s, device=device)[0]
    console.print(comparison_table(plan, measured))
    for line in summary_lines(plan, measured):
        console.print(line, markup=False, highlight=False)
    return measured
