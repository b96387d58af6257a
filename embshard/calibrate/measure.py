"""Run a ShardingPlan on local ranks and measure each rank's time per phase of a step.

    from embshard.calibrate.measure import measure_plans
    results = measure_plans([plan], steps=10)      # spawns plan.topology.world_size gloo ranks on CPU
    results = measure_plans([plan], device="cuda")  # nccl ranks, one GPU each
    results[0].ranks[r].cpu_ms["lookup_bwd"]

Every rank builds the sharded collections of the plan (pooled tables in a
ShardedEmbeddingBagCollection, sequence tables in a ShardedEmbeddingCollection), feeds them
synthetic batches drawn from the table specs (embshard.calibrate.synthetic) and runs
forward + backward (with the fused optimizer update). Phases are those of the planner's
`Perf`: forward phases come from the collections' timer hook (`collection.timer`, the
runtime's PhaseTimer interface); backward phases from autograd node hooks: the lookup
kernels' backward nodes (and the allreduce-mode replicas' `_LocalLookup`: their dense gradients
and update, embshard.runtime.dense_replicas) are lookup_bwd; the collectives' backward nodes are output_dist_bwd:
the sharded tables' all-to-all (`_AllToAll`) and the data-parallel replicas' exchange of
every rank's pooled gradients (`_LocalPart`, embshard.runtime.comm.local_part), which the
cost model charges to output_dist_bwd too (replicated_lookup_perf); the data-parallel replicas'
backward in "allreduce" mode (`_LocalLookup`, embshard.runtime.dense_replicas: dense gradients, the
optimizer) is lookup_bwd, as allreduce_perf prices it; collectives run inside a lookup backward node
count as dp_allreduce (timed by wrapping torch.distributed's collectives, and the hierarchical
all-reduce whole with its copies and sums, in the measuring process). Backward work outside those nodes (output assembly)
counts as output_dist_bwd. The step is forward + backward of the
collections; the harness's own work (batches, gradient seeds, hooks) is not counted.

Each phase is timed two ways: CPU time of the rank's process (user + system, all its
threads, gloo's included) and wall-clock time. On cuda both are wall-clock time read after
torch.cuda.synchronize() (embshard.calibrate.device.clock_reader): kernels run
asynchronously, so CPU time would count only their launches; the ``cpu_ms`` fields then
hold that synchronized wall time. CPU time is the *per-rank* measure: it is what
the rank's work costs on a core of its own, whatever else runs on the machine, and does not
count waiting for slower peers inside collectives. Wall-clock time, with more ranks than
cores or other load, also counts time the rank was not scheduled and time spent waiting for
the slowest rank, so it says more about the machine than about the plan.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from embshard.calibrate.device import BACKENDS, clock_reader
from embshard.planner.plan import ShardingPlan
from embshard.ports import free_port
from embshard.procs import wait_all

PHASES = ("input_dist_ms", "lookup_fwd_ms", "output_dist_fwd_ms", "output_dist_bwd_ms", "lookup_bwd_ms", "dp_allreduce_ms")
# collection timer phase -> Perf field
FORWARD_PHASES = {"input_dist": "input_dist_ms", "lookup": "lookup_fwd_ms", "output_dist": "output_dist_fwd_ms"}


@dataclass(frozen=True)
class RankMeasurement:
    """Median over measured steps of one rank's per-phase times (ms), CPU and wall clock."""

    rank: int
    cpu_ms: dict[str, float]  # PHASES and "total_ms"
    wall_ms: dict[str, float]


@dataclass(frozen=True)
class PlanMeasurement:
    ranks: tuple[RankMeasurement, ...]
    step_wall_ms: float  # wall clock per step between barriers (rank 0), all ranks running together
    steps: int

    @property
    def max_rank_cpu_ms(self) -> float:
        return max(r.cpu_ms["total_ms"] for r in self.ranks)


# ---- inside a rank ----------------------------------------------------------------------------


class PhaseClock:
    """Sums CPU (on cuda: synchronized wall) and wall seconds per phase. Duck-types
    embshard.runtime.timing.PhaseTimer (``collection.timer = clock``), and times autograd nodes in backward."""

    def __init__(self, device: str = "cpu") -> None:
        self.read = clock_reader(device)  # () -> (rank seconds, wall seconds)
        self.cpu: dict[str, float] = defaultdict(float)
        self.wall: dict[str, float] = defaultdict(float)
        self.in_lookup_bwd = False  # set while a lookup backward node runs
        self.in_sync = False  # set while a timed collective runs (those it calls are not timed again)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        c0, w0 = self.read()
        try:
            yield
        finally:
            c1, w1 = self.read()
            self.add(name, c1 - c0, w1 - w0)

    def add(self, name: str, cpu_s: float, wall_s: float) -> None:
        self.cpu[name] += cpu_s
        self.wall[name] += wall_s

    def reset(self) -> None:
        self.cpu.clear()
        self.wall.clear()


# backward node (class name fragment) -> phase
BACKWARD_NODES = {"LookupFunction": "lookup_bwd_ms", "_TorchLookup": "lookup_bwd_ms",  # FBGEMM / torch lookup kernels
                  "_LocalLookup": "lookup_bwd_ms",  # data-parallel replicas ("allreduce" mode): their update and all-reduce
                  "_AllToAll": "output_dist_bwd_ms",  # sharded tables' embedding gradients back to the holders
                  "_LocalPart": "output_dist_bwd_ms"}  # data-parallel replicas: every rank's gradients to every replica


def _node_phase(name: str) -> str | None:
    return next((phase for fragment, phase in BACKWARD_NODES.items() if fragment in name), None)


def instrument_backward(roots: Sequence[Any], clock: PhaseClock) -> int:
    """Time the lookup and collective nodes (BACKWARD_NODES) of the graph behind ``roots``; returns how many."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    found = 0
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        phase = _node_phase(node.name())
        if phase is not None:
            found += 1
            start: list[float] = []

            def pre(grad_outputs, start=start, phase=phase):
                clock.in_lookup_bwd = phase == "lookup_bwd_ms"
                start[:] = clock.read()

            def post(grad_inputs, grad_outputs, start=start, phase=phase):
                c1, w1 = clock.read()
                clock.add(phase, c1 - start[0], w1 - start[1])
                clock.in_lookup_bwd = False

            node.register_prehook(pre)
            node.register_hook(post)
        stack.extend(n for n, _ in node.next_functions if n is not None)
    return found


@contextmanager
def timed_replica_sync(clock: PhaseClock) -> Iterator[None]:
    """Time the collectives data-parallel replicas run inside their backward (all_reduce,
    all_to_all_single, all_gather_into_tensor, reduce_scatter_tensor, on gloo or through shared memory
    (`embshard.runtime.shared_group`), and the hierarchical all-reduce whole: its copies and sums too) as
    dp_allreduce_ms: these functions are wrapped in this process while a lookup backward node runs.

    The allreduce mode's all-reduce runs here whole inside its lookup backward node, and its optimizer step (which the
    runtime runs in an engine callback when backward ends, `DenseReplicas._apply_landed`) as lookup_bwd_ms: in
    training the all-reduce is in flight while the rest of backward runs, so its CPU work (gloo's threads) and its
    wait would count as whatever phase runs meanwhile or as output dist. The cost model prices the exchange as
    dp_allreduce and the update as lookup backward (`embshard.planner.cost.perf.allreduce_perf`), so that is what
    is measured."""
    import torch.distributed as dist

    from embshard.runtime import dense_replicas, wire
    from embshard.runtime.shared_group import SharedGroup

    def all_reduce_now(flat, cuts, pg, dtype):  # wire_all_reduce_pieces_, the pieces summed before it returns
        wire.wire_all_reduce_(flat, pg, dtype)
        return [lambda: None] * (len(cuts) + 1)

    apply_landed = dense_replicas.DenseReplicas._apply_landed

    def timed_update(self, *args, **kwargs):
        with clock.phase("lookup_bwd_ms"):
            return apply_landed(self, *args, **kwargs)

    targets = [*((dist, n) for n in ("all_reduce", "all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor")),
               *((SharedGroup, n) for n in ("sum_", "all_to_all", "reduce_scatter", "all_gather")),  # one host's ranks
               (wire, "hierarchical_all_reduce")]
    originals = [(module, n, getattr(module, n)) for module, n in targets]

    def wrap(fn):
        def timed(*args, **kwargs):
            if not clock.in_lookup_bwd or clock.in_sync:
                return fn(*args, **kwargs)
            clock.in_sync = True
            try:
                with clock.phase("dp_allreduce_ms"):
                    return fn(*args, **kwargs)
            finally:
                clock.in_sync = False
        return timed

    for module, n, fn in originals:
        setattr(module, n, wrap(fn))
    overlapped = dense_replicas.wire_all_reduce_pieces_
    dense_replicas.wire_all_reduce_pieces_ = all_reduce_now
    dense_replicas.DenseReplicas._apply_landed = timed_update
    try:
        yield
    finally:
        for module, n, fn in originals:
            setattr(module, n, fn)
        dense_replicas.wire_all_reduce_pieces_ = overlapped
        dense_replicas.DenseReplicas._apply_landed = apply_landed


def run_plan_in_rank(plan: ShardingPlan, pg, steps: int, warmup: int, seed: int = 0, num_batches: int = 3,
                     device: str = "cpu") -> dict[str, Any]:
    """Build the plan's collections on this rank (tables on ``device``: cpu, or this rank's GPU),
    run warmup + steps, return per-step phase times (s)."""
    import torch
    import torch.distributed as dist

    from embshard.calibrate.synthetic import synthetic_batch
    from embshard.runtime import ShardedEmbeddingBagCollection, ShardedEmbeddingCollection

    rank = dist.get_rank(pg)
    where = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    B = plan.topology.batch_size_per_rank
    pooled = [s for s in plan.specs if s.pooled]
    sequence = [s for s in plan.specs if not s.pooled]
    collections = []
    if pooled:
        collections.append((ShardedEmbeddingBagCollection(pooled, plan, pg, device=where), pooled))
    if sequence:
        collections.append((ShardedEmbeddingCollection(sequence, plan, pg, device=where), sequence))
    gen = torch.Generator().manual_seed(seed * 7919 + rank)
    batches = [[synthetic_batch(specs, B, gen).to(where) for _, specs in collections] for _ in range(num_batches)]
    clock = PhaseClock(device)
    for module, _ in collections:
        module.timer = clock
    per_step: list[dict[str, tuple[float, float]]] = []

    def one_step(inputs) -> None:
        roots = []
        for (module, _), kjt in zip(collections, inputs):
            with clock.phase("forward"):
                out = module(kjt)
            roots.extend([out.values()] if hasattr(out, "length_per_key") else [jt.values() for jt in out.values()])
        instrument_backward(roots, clock)
        grads = [torch.ones_like(r) for r in roots]
        with clock.phase("backward"):
            torch.autograd.backward(roots, grads)

    with timed_replica_sync(clock):
        for i in range(warmup):
            one_step(batches[i % num_batches])
        dist.barrier(group=pg)
        w_start = clock.read()[1]
        for i in range(steps):
            clock.reset()
            one_step(batches[i % num_batches])
            per_step.append({k: (clock.cpu[k], clock.wall[k]) for k in clock.cpu})
        dist.barrier(group=pg)
        step_wall_s = (clock.read()[1] - w_start) / max(steps, 1)
    for module, _ in collections:
        module.timer = None
    return {"rank": rank, "per_step": per_step, "step_wall_s": step_wall_s}


def summarize_rank(raw: dict[str, Any]) -> RankMeasurement:
    """Per-step seconds -> median ms per phase. The step is the collections' forward calls and
    the backward pass (not the harness's own work: batches, gradient seeds, hooks). Forward
    work outside the collections' timed phases (packaging outputs) and backward work outside
    the timed nodes (assembly gradients) count as output dist, with the timed collective
    nodes; collectives inside lookup nodes count as dp_allreduce and are taken out of lookup_bwd."""
    cpu_rows, wall_rows = [], []
    for step in raw["per_step"]:
        for which, rows in ((0, cpu_rows), (1, wall_rows)):
            get = lambda k: step.get(k, (0.0, 0.0))[which] * 1e3  # noqa: E731
            row = {FORWARD_PHASES[k]: get(k) for k in FORWARD_PHASES}
            row["output_dist_fwd_ms"] += max(get("forward") - sum(get(k) for k in FORWARD_PHASES), 0.0)
            allreduce = get("dp_allreduce_ms")
            lookup_bwd = max(get("lookup_bwd_ms") - allreduce, 0.0)
            row["lookup_bwd_ms"] = lookup_bwd
            row["dp_allreduce_ms"] = allreduce
            collectives = get("output_dist_bwd_ms")
            row["output_dist_bwd_ms"] = collectives + max(get("backward") - lookup_bwd - allreduce - collectives, 0.0)
            row["total_ms"] = get("forward") + get("backward")
            rows.append(row)
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    keys = (*PHASES, "total_ms")
    return RankMeasurement(raw["rank"], {k: med(cpu_rows, k) for k in keys}, {k: med(wall_rows, k) for k in keys})


# ---- spawning ranks -----------------------------------------------------------------------------


def run_ranks(world_size: int, job: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
    """Run ``job`` (see embshard.calibrate.worker) on world_size local ranks; each rank's JSON result.

    Ranks are separate processes with one torch thread each: gloo ranks on CPU, or nccl ranks
    on GPUs 0..world_size-1 for a job with ``"device": "cuda"``; they are killed at the timeout.
    Raises RuntimeError with the failing rank's last output lines.
    """
    with tempfile.TemporaryDirectory(prefix=f"embshard-measure-w{world_size}-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        port = free_port()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, "-m", "embshard.calibrate.worker", str(job_path), str(r), str(world_size),
                                   str(port), str(Path(tmp) / f"rank{r}.json")],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r in range(world_size)]
        logs, timed_out = wait_all(procs, timeout_s)
        for r, p in enumerate(procs):
            if p.returncode != 0:
                tail = " | ".join(line for line in logs[r].strip().splitlines()[-6:])
                why = f"timed out after {timeout_s:.0f} s" if timed_out else f"exited with {p.returncode}"
                raise RuntimeError(f"rank {r} of {world_size} {why}: {tail}")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(world_size)]


def measure_plans(plans: Sequence[ShardingPlan], *, steps: int = 10, warmup: int = 3, seed: int = 0,
                  timeout_s: float = 900.0, device: str = "cpu") -> list[PlanMeasurement]:
    """Measure plans of one world size on local ranks (one process group for all of them), on
    CPU over gloo or, with device="cuda", one GPU per rank over nccl."""
    if not plans:
        return []
    sizes = {p.topology.world_size for p in plans}
    if len(sizes) != 1:
        raise ValueError(f"measure_plans: plans for different world sizes {sorted(sizes)}; measure each size separately")
    world_size = sizes.pop()
    assert device in BACKENDS, device
    job = {"kind": "plans", "plans": [p.to_dict() for p in plans], "steps": steps, "warmup": warmup, "seed": seed, "device": device}
    per_rank = run_ranks(world_size, job, timeout_s)
    out = []
    for i in range(len(plans)):
        raws = [r["plans"][i] for r in per_rank]
        out.append(PlanMeasurement(tuple(summarize_rank(raw) for raw in raws), raws[0]["step_wall_s"] * 1e3, steps))
    return out


def measure_rounds(plans: Sequence[ShardingPlan], rounds: int, *, steps: int = 10, warmup: int = 3, timeout_s: float = 3600.0,
                   log=print) -> list[list[PlanMeasurement]]:
    """Measure plans of one world size ``rounds`` times, every other round in reverse order,
    so slow drifts of the machine's load hit every plan alike; per plan, its measurement of
    each round (in round order)."""
    if rounds < 1:
        raise ValueError(f"measure_rounds: rounds must be >= 1, got {rounds}")
    if not plans:
        return []
    per_plan: list[list[PlanMeasurement]] = [[] for _ in plans]
    for rnd in range(rounds):
        order = list(range(len(plans))) if rnd % 2 == 0 else list(range(len(plans)))[::-1]
        log(f"round {rnd + 1}/{rounds}: measuring {len(plans)} plans on {plans[0].topology.world_size} ranks")
        for j, m in zip(order, measure_plans([plans[j] for j in order], steps=steps, warmup=warmup, timeout_s=timeout_s)):
            per_plan[j].append(m)
    return per_plan
