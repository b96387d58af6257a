"""Microbenchmarks of the rank-local lookups, measured through the runtime on one rank.

Each point is one table of ``rows x dim`` looked up by ``batch`` bags of on average
``pooling`` ids (of each of ``features`` features: several take FBGEMM's shared-table backward
path), placed table_wise ("fbgemm": FBGEMM's table-batched kernel with the fused
rowwise_adagrad update, pooled or sequence) or data_parallel on a one-rank gloo group, in either
of the runtime's modes: "dp" (replicated look-up, a fused update of the rows looked up) or
"allreduce" (local look-up, the dense gradient of the whole table and its optimizer on every row:
the full-table work that ``dp_dense_gb_per_s`` prices). Going through the public runtime (a sharded collection
with a timer, embshard.calibrate.measure) keeps the benchmark honest as the runtime
changes: the lookup phases are exactly what a rank runs, and the input/output dist phases
at one rank measure the per-id work of routing without any network transfer. On cuda the
one rank is an nccl rank on GPU 0, its tables and batches on the GPU.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, replace
from typing import Any, Sequence

from embshard.planner.api import evaluate, manual_plan, placement_for
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.specs import TableSpec
from embshard.topology import Topology


@dataclass(frozen=True)
class KernelPoint:
    kind: str  # "fbgemm" | "dp" | "allreduce"
    pooled: bool
    rows: int
    dim: int
    batch: int
    pooling: float
    features: int = 1  # features looking the table up, each ``batch`` bags (several: FBGEMM's shared-table path)
    ranks: int = 1  # ranks of one host running it (a data-parallel table: replicated on all of them)

    def spec(self) -> TableSpec:
        names = ("t",) if self.features == 1 else tuple(f"t{i}" for i in range(self.features))
        return TableSpec("t", self.rows, self.dim, float(self.pooling), pooled=self.pooled, feature_names=names)

    def topology(self, device: str = "cpu") -> Topology:
        return Topology(world_size=self.ranks, local_world_size=self.ranks, hbm_gib=64, batch_size_per_rank=self.batch,
                        device=device)

    def plan(self, topology: Topology | None = None) -> ShardingPlan:
        topology = topology or self.topology()
        if self.kind == "fbgemm":
            return manual_plan([self.spec()], topology, {"t": (ShardingType.TABLE_WISE, [0])})
        placement = placement_for(self.spec(), topology, ShardingType.DATA_PARALLEL, tuple(range(self.ranks)))
        mode = "allreduce" if self.kind == "allreduce" else "replicated_lookup"
        return evaluate([self.spec()], topology, [replace(placement, data_parallel_mode=mode)])


def grid(dims: Sequence[int], rows: Sequence[int], batches: Sequence[int], poolings: Sequence[float],
         sequence: bool, dp_max_rows: int, max_table_elements: int, shared_features: int = 0,
         allreduce_ranks: int = 1) -> list[KernelPoint]:
    """Pooled fbgemm points over the full grid, sequence points (if ``sequence``) and
    data-parallel points in both modes (tables up to dp_max_rows rows) over the same grid, and pooled points of a
    table that ``shared_features`` features look up (if 2 or more; the smallest batch only); tables above
    max_table_elements (rows x dim) are skipped. The allreduce mode's points run on ``allreduce_ranks`` ranks: every
    rank streams its whole replica at once, sharing the host's memory bandwidth, and the gradient is all-reduced,
    as in training (one rank alone streams faster: 3 tables of 750k rows x 64 in all took 255-283 ms a step on one
    rank, 492-502 ms a rank on 2 ranks of the 2-core Intel VM, of which the model puts ~115 in the all-reduce)."""
    points = []
    for d, n, b, p in itertools.product(dims, rows, batches, poolings):
        if n * d > max_table_elements:
            continue
        points.append(KernelPoint("fbgemm", True, n, d, b, p))
        if shared_features > 1 and b == min(batches):
            points.append(KernelPoint("fbgemm", True, n, d, b, p, shared_features))
        if sequence:
            points.append(KernelPoint("fbgemm", False, n, d, b, p))
        if n <= dp_max_rows:
            points += [KernelPoint("dp", True, n, d, b, p), KernelPoint("allreduce", True, n, d, b, p, ranks=allreduce_ranks)]
    return points


def run(points: Sequence[KernelPoint], steps: int = 5, warmup: int = 2, timeout_s: float = 1800.0,
        device: str = "cpu") -> list[dict[str, Any]]:
    """Measure every point on its spawned ranks (cpu, or GPUs 0.. for device="cuda"), the points of each rank count
    together; rows of the point's fields plus rank 0's measured ms by phase (cpu_*: the rank's time, see
    embshard.calibrate.device), in the order of ``points``."""
    from embshard.calibrate.measure import measure_plans

    rows: dict[int, dict[str, Any]] = {}
    for ranks in sorted({p.ranks for p in points}):
        mine = [i for i, p in enumerate(points) if p.ranks == ranks]
        measured = measure_plans([points[i].plan(points[i].topology(device)) for i in mine], steps=steps, warmup=warmup,
                                 timeout_s=timeout_s, device=device)
        for i, m in zip(mine, measured):
            rows[i] = {**asdict(points[i]), **{f"cpu_{k}": v for k, v in m.ranks[0].cpu_ms.items()}}
    return [rows[i] for i in range(len(points))]
