"""Memory feasibility: does a problem fit the ranks, does a placement respect the caps, and if
not, which reservation is in the way and what would fix it.

A rank's memory (``topology.hbm_gib``) goes first to two reservations whatever the layout:
``topology.reserved_fraction`` of it for dense parameters and activations, and the output
buffers of the rank's own samples for every table (embeddings and, in training, their
gradients; they scale with ``topology.batch_size_per_rank``). Shards and replicas get the rest.
"""

from __future__ import annotations

import math
from typing import Sequence

from embshard.planner.search.problem import CandVec, Problem
from embshard.planner.types import Storage
from embshard.topology import GIB, Topology

BATCH_HINT_SHARE = 0.1  # the batch-size fix is named when batch-sized buffers take this share of a rank's budget


class PlanInfeasibleError(ValueError):
    """The tables cannot fit the topology's memory; the message says which and what would fix it."""


def _gib(num_bytes: float) -> str:
    """A size for a message: GiB with two decimals, or MiB / bytes when that would show 0.00."""
    if num_bytes >= 0.005 * GIB:
        return f"{num_bytes / GIB:.2f} GiB"
    return f"{num_bytes / 2**20:.2f} MiB" if num_bytes >= 0.005 * 2**20 else f"{int(num_bytes)} bytes"


def _kinds(storage: Storage) -> str:
    """'weights 0.60 GiB, I/O buffers 0.05 GiB': the kinds of bytes that make at least 1% of the total."""
    kinds = (("weights", storage.weights_bytes), ("optimizer state", storage.optimizer_bytes), ("I/O buffers", storage.io_bytes))
    return ", ".join(f"{name} {_gib(n)}" for name, n in kinds if n and n >= 0.01 * storage.total_bytes)


def budget_text(problem: Problem) -> str:
    """Where a rank's memory goes before any shard: 'hbm_gib=H per rank: R reserved ..., B of output buffers ..., F left for shards'."""
    topo = problem.topo
    outputs = "embedding outputs" if problem.inference else "embedding outputs and their gradients"
    left = max(problem.free_bytes, 0)
    return (f"hbm_gib={topo.hbm_gib:g} per rank: {_gib(topo.reserved_bytes)} reserved for dense parameters and activations "
            f"(topology.reserved_fraction={topo.reserved_fraction:g}), {_gib(problem.base_mem)} of output buffers for the rank's "
            f"own {topo.batch_size_per_rank} samples ({outputs} of every table; topology.batch_size_per_rank), "
            f"{_gib(left)} left for shards")


def _batch_fix(problem: Problem, batch_bytes: float) -> str:
    """', a smaller topology.batch_size_per_rank (...)' when batch-sized buffers matter, else ''."""
    if batch_bytes < BATCH_HINT_SHARE * problem.cap_bytes:
        return ""
    return f", a smaller topology.batch_size_per_rank (buffers that scale with it take {_gib(batch_bytes)} of the rank)"


def check_memory(problem: Problem) -> None:
    """Raise PlanInfeasibleError naming what cannot fit (the fixed buffers, tables, or all of them), by how much, and fixes."""
    _check_fixed_buffers(problem)
    topo, cap = problem.topo, problem.free_bytes
    too_big, worst_io, weights_bound = [], 0, False
    for unit in problem.units:
        best = min(unit.cands, key=lambda cv: max(cv.shard_mem, default=0) + cv.every_mem)
        need = max(best.shard_mem, default=0) + best.every_mem
        if need > cap:
            parts = largest_need(best)
            worst_io = max(worst_io, parts.io_bytes)
            weights_bound |= parts.weights_bytes + parts.optimizer_bytes > parts.io_bytes
            too_big.append(f"{unit.name} needs {_gib(need)} on one rank even as {best.label} ({_kinds(parts)}; {_gib(need - cap)} over)")
    if too_big:
        # more ranks and finer splits shrink weights; a shard's output buffers grow with the global batch
        weights_fix = (", add ranks, allow row_wise/column_wise for these tables, use dtype fp16 (or int8 when serving), "
                       "a lighter optimizer (sgd/rowwise_adagrad)" if weights_bound else ", allow column_wise for these tables")
        raise PlanInfeasibleError(
            f"infeasible: {len(too_big)} table(s) cannot fit the {_gib(cap)} a rank has for shards ({budget_text(problem)}): "
            f"{'; '.join(too_big[:5])}{' ...' if len(too_big) > 5 else ''}. Fix: raise topology.hbm_gib{weights_fix}"
            f"{_batch_fix(problem, problem.base_mem + worst_io)}")
    W = topo.world_size
    total = sum(min(sum(cv.shard_mem) + W * cv.every_mem for cv in u.cands) for u in problem.units)
    if total > W * cap:
        biggest = sorted(problem.units, key=lambda u: -min(sum(cv.shard_mem) for cv in u.cands))[:3]
        need_gib = (total / W + problem.base_mem) / GIB / (1 - topo.reserved_fraction)
        raise PlanInfeasibleError(
            f"infeasible: the tables need {total / GIB:.1f} GiB in all but {W} ranks x {_gib(cap)} = {W * cap / GIB:.1f} GiB "
            f"are left for shards ({(total - W * cap) / GIB:.1f} GiB short; largest: {', '.join(u.name for u in biggest)}; "
            f"{budget_text(problem)}). Fix: topology.hbm_gib >= {need_gib:.2f}, more ranks, fp16 tables (int8 when serving), "
            f"a lighter optimizer{_batch_fix(problem, problem.base_mem)}")


def _check_fixed_buffers(problem: Problem) -> None:
    """The reservations every rank makes whatever the layout must leave room for shards."""
    if problem.free_bytes > 0:
        return
    topo = problem.topo
    B, base, cap = topo.batch_size_per_rank, problem.base_mem, problem.cap_bytes
    outputs = "embedding outputs" if problem.inference else "embedding outputs and their gradients"
    half_batch = math.floor(B * cap / (2 * base))  # buffers then take half of what the reserve leaves
    batch_fix = (f"lower topology.batch_size_per_rank to {half_batch} or less (the buffers scale with it; at {half_batch} "
                 f"they take half of the {_gib(cap)})" if half_batch >= 1 else
                 "shrink the model (even one sample per rank fills half of it)")
    hbm_fix = 2 * base / (1 - topo.reserved_fraction) / GIB
    step = 10.0 ** (math.floor(math.log10(hbm_fix)) - 2)
    hbm_fix = math.ceil(hbm_fix / step) * step  # three significant digits, rounded up
    reserve_fix = (", or a smaller topology.reserved_fraction if the dense model needs less than "
                   f"{_gib(topo.reserved_bytes)}" if base < topo.rank_memory_bytes else "")
    raise PlanInfeasibleError(
        f"infeasible: the output buffers alone do not fit a rank: hbm_gib={topo.hbm_gib:g} leaves {_gib(cap)} after "
        f"{_gib(topo.reserved_bytes)} reserved for dense parameters and activations (topology.reserved_fraction="
        f"{topo.reserved_fraction:g}), but every rank needs {_gib(base)} of buffers for its own {B} samples ({outputs} of "
        f"every table; topology.batch_size_per_rank) whatever the layout, and more ranks do not shrink them. Fix: raise "
        f"topology.hbm_gib to {hbm_fix:.3g} or more (half of it then left for the tables), or {batch_fix}{reserve_fix}")


def largest_need(cv: CandVec) -> Storage:
    """What the candidate's largest shard (and, data-parallel, its replica) costs one rank, by kind."""
    parts = Storage()
    if cv.num_shards:
        i = max(range(cv.num_shards), key=cv.shard_mem.__getitem__)
        for c in cv.cand:
            parts = parts + c.shards[i].storage
    if cv.data_parallel:  # (a data-parallel unit is one table) its replica, less the output buffers reserved up front
        st = cv.cand[0].every_rank_storage
        parts = parts + Storage(st.weights_bytes, st.optimizer_bytes, st.io_bytes - (st.total_bytes - cv.every_mem))
    return parts


def fragmentation_message(problem: Problem, unit_index: int) -> str:
    unit = problem.units[unit_index]
    return (f"infeasible: no rank has room left for {unit.name} in any allowed layout after placing larger tables "
            f"({budget_text(problem)}). Fix: raise topology.hbm_gib, add ranks, or allow row_wise for {unit.name}"
            f"{_batch_fix(problem, problem.base_mem)}")


def check_caps(used: Sequence[Storage], topology: Topology, where: str = "placements") -> None:
    """Raise PlanInfeasibleError if a rank's shards and buffers exceed its cap (topology.shard_memory_cap_bytes)."""
    cap = topology.shard_memory_cap_bytes
    over = [(r, s) for r, s in enumerate(used) if s.total_bytes > cap]
    if not over:
        return
    listed = "; ".join(f"rank {r} holds {_gib(s.total_bytes)} ({_kinds(s)})" for r, s in over[:5])
    batch_fix = (" or lower topology.batch_size_per_rank (I/O buffers scale with it)"
                 if max(s.io_bytes for _, s in over) >= BATCH_HINT_SHARE * cap else "")
    raise PlanInfeasibleError(
        f"{where}: {len(over)} rank(s) exceed the {_gib(cap)} a rank has for embeddings (hbm_gib={topology.hbm_gib:g} less "
        f"topology.reserved_fraction={topology.reserved_fraction:g}): {listed}{' ...' if len(over) > 5 else ''}. Fix: move or "
        f"split shards off these ranks, raise topology.hbm_gib{batch_fix}")
