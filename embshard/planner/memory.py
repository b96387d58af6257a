"""Memory feasibility: does a problem fit the ranks, does a placement respect the caps, and if
not, which reservation is in the way and what would fix it.

A rank's memory (``topology.hbm_gib``) goes first to two reservations whatever the layout:
``topology.reserved_fraction`` of it for dense parameters and activations, and the output
buffers of the rank's own samples for every table (embeddings and, in training, their
gradients; they scale with ``topology.batch_size_per_rank``). Shards and replicas get the rest.
With ``topology.ddr_gib``, shards may keep their weights in host memory instead (tiers); then
the tables must fit HBM and host memory together (`_check_tiered_totals`, the same memory rows
as the lower bound's LP), and a shortfall names each memory's separately.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from embshard.planner.search.bound import fitting_columns
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
    host_cap = problem.host_cap_bytes
    no_host_room = []
    for unit in problem.units:
        cands = [cv for cv in unit.cands if cv.largest_host_mem <= host_cap]
        if not cands:  # every layout keeps shards in host memory and none fits (HBM layouts always have host room)
            least = min(cv.largest_host_mem for cv in unit.cands)
            no_host_room.append(f"{unit.name} needs {_gib(least)} of host memory on one rank ({_gib(least - host_cap)} over)")
            continue
        best = min(cands, key=lambda cv: cv.largest_mem + cv.every_mem)
        need = best.largest_mem + best.every_mem
        if need > cap:
            parts = largest_need(best)
            worst_io = max(worst_io, parts.io_bytes)
            weights_bound |= parts.weights_bytes + parts.optimizer_bytes > parts.io_bytes
            tiered = [max(cv.shard_host_mem) for cv in unit.cands if cv.shard_host_mem]
            in_host = (f", and kept in host memory {_gib(min(tiered))} of host memory on one rank (topology.ddr_gib="
                       f"{topo.ddr_gib:g})" if tiered and min(tiered) > host_cap else "")
            too_big.append(f"{unit.name} needs {_gib(need)} on one rank even as {best.label} ({_kinds(parts)}; {_gib(need - cap)} over)"
                           f"{in_host}")
    if no_host_room:
        raise PlanInfeasibleError(
            f"infeasible: {len(no_host_room)} table(s) fit no rank's host memory (topology.ddr_gib={topo.ddr_gib:g} per rank): "
            f"{'; '.join(no_host_room[:5])}{' ...' if len(no_host_room) > 5 else ''}. Fix: raise topology.ddr_gib, add ranks, "
            f"or allow row_wise for these tables")
    if too_big:
        # more ranks and finer splits shrink weights; a shard's output buffers grow with the global batch
        weights_fix = (", add ranks, allow row_wise/column_wise for these tables, use dtype fp16 (or int8 when serving), "
                       "a lighter optimizer (sgd/rowwise_adagrad)" if weights_bound else ", allow column_wise for these tables")
        raise PlanInfeasibleError(
            f"infeasible: {len(too_big)} table(s) cannot fit the {_gib(cap)} a rank has for shards ({budget_text(problem)}): "
            f"{'; '.join(too_big[:5])}{' ...' if len(too_big) > 5 else ''}. Fix: raise topology.hbm_gib{weights_fix}"
            f"{_batch_fix(problem, problem.base_mem + worst_io)}")
    W = topo.world_size
    if host_cap:
        _check_tiered_totals(problem)
        return
    total = sum(min(sum(cv.shard_mem) + W * cv.every_mem for cv in u.cands) for u in problem.units)
    if total > W * cap:
        biggest = sorted(problem.units, key=lambda u: -min(sum(cv.shard_mem) for cv in u.cands))[:3]
        need_gib = (total / W + problem.base_mem) / GIB / (1 - topo.reserved_fraction)
        raise PlanInfeasibleError(
            f"infeasible: the tables need {total / GIB:.1f} GiB in all but {W} ranks x {_gib(cap)} = {W * cap / GIB:.1f} GiB "
            f"are left for shards ({(total - W * cap) / GIB:.1f} GiB short; largest: {', '.join(u.name for u in biggest)}; "
            f"{budget_text(problem)}). Fix: topology.hbm_gib >= {need_gib:.2f}, more ranks, fp16 tables (int8 when serving), "
            f"a lighter optimizer{_batch_fix(problem, problem.base_mem)}")


def _least_total(problem: Problem, minimise_host: bool, columns: list[tuple[int, CandVec]]) -> float | None:
    """The least cluster-wide HBM (or host memory) bytes of any fractional choice among `columns`
    that fits the other memory in all and every rank's replicas (the lower bound's memory rows);
    None if none fits."""
    W, cap, host_cap = problem.topo.world_size, problem.free_bytes, problem.host_cap_bytes
    hbm = np.array([float(sum(cv.shard_mem) + W * cv.every_mem) for _, cv in columns])
    host = np.array([float(sum(cv.shard_host_mem)) for _, cv in columns])
    every = np.array([float(cv.every_mem) for _, cv in columns])
    n = len(columns)
    A_eq = coo_matrix((np.ones(n), ([ui for ui, _ in columns], np.arange(n))), shape=(len(problem.units), n))
    other, other_cap = (hbm, W * cap) if minimise_host else (host, W * host_cap)
    res = linprog(host if minimise_host else hbm, A_ub=np.vstack([other, every]), b_ub=[float(other_cap), float(cap)],
                  A_eq=A_eq, b_eq=np.ones(len(problem.units)), bounds=(0, 1), method="highs")
    return float(res.fun) if res.status == 0 else None


def _least_hbm_choice_fits(problem: Problem, columns: list[tuple[int, CandVec]]) -> bool:
    """Whether each unit's column of least HBM together fit the cluster's HBM and host memory and one rank's
    replicas: then the LP of `_least_total` (least HBM) has a solution at most W * cap, and need not be solved
    (it usually fits: most of the host memory is left; criteo_tb_measured on 8 ranks: 6 of its 8 CPU ms a plan)."""
    W = problem.topo.world_size
    least: dict[int, CandVec] = {}
    for ui, cv in columns:
        if ui not in least or sum(cv.shard_mem) + W * cv.every_mem < sum(least[ui].shard_mem) + W * least[ui].every_mem:
            least[ui] = cv
    chosen = list(least.values())
    return (len(chosen) == len(problem.units) and sum(sum(cv.shard_mem) + W * cv.every_mem for cv in chosen) <= W * problem.free_bytes
            and sum(sum(cv.shard_host_mem) for cv in chosen) <= W * problem.host_cap_bytes
            and sum(cv.every_mem for cv in chosen) <= problem.free_bytes)


def _check_tiered_totals(problem: Problem) -> None:
    """With host memory for tables: HBM and host memory of all ranks together must hold the tables
    (the lower bound's memory rows); if not, name the HBM and the host shortfall separately."""
    topo = problem.topo
    W, cap, host_cap = topo.world_size, problem.free_bytes, problem.host_cap_bytes
    fitting = fitting_columns(problem)
    if _least_hbm_choice_fits(problem, fitting):  # a feasible point of the LP below, at most W * cap
        return
    least_hbm = _least_total(problem, False, fitting)  # host memory used as far as it goes
    if least_hbm is not None and least_hbm <= W * cap * (1 + 1e-9):
        return
    if least_hbm is None:  # some unit has no layout whose shards fit a rank: reported per table before this
        least_hbm = sum(min(sum(cv.shard_mem) + W * cv.every_mem for cv in u.cands) for u in problem.units)
    every = [(ui, cv) for ui, u in enumerate(problem.units) for cv in u.cands]
    least_host = _least_total(problem, True, every)  # HBM used as far as it goes
    if least_host is not None and least_host > W * host_cap:
        host_text = (f"host memory at least {(least_host - W * host_cap) / GIB:.1f} GiB short (with HBM used to the full they need "
                     f"{least_host / GIB:.1f} GiB of it, {W} ranks x topology.ddr_gib={topo.ddr_gib:g} = "
                     f"{W * host_cap / GIB:.1f} GiB)")
    elif least_host is not None:  # enough in all, but the shards that would have to move there do not fit one rank's
        largest = max((max(cv.shard_host_mem) for _, cv in every if cv.shard_host_mem), default=0)
        host_text = (f"host memory 0.0 GiB short in all, but a shard kept there needs up to {_gib(largest)} on one rank "
                     f"(topology.ddr_gib={topo.ddr_gib:g}); allow row_wise for the largest tables")
    else:
        host_text = "and even with every table in host memory the caches and buffers do not fit HBM"
    raise PlanInfeasibleError(
        f"infeasible: the tables fit neither HBM nor host memory: HBM at least {(least_hbm - W * cap) / GIB:.1f} GiB short (with host "
        f"memory used to the full they need {least_hbm / GIB:.1f} GiB of it, {W} ranks x {_gib(cap)} = {W * cap / GIB:.1f} GiB "
        f"left for shards; {budget_text(problem)}); {host_text}. Fix: raise topology.ddr_gib or topology.hbm_gib, more "
        f"ranks, fp16 tables (int8 when serving), a lighter optimizer")


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
    """Raise PlanInfeasibleError if a rank's shards and buffers exceed its cap (topology.shard_memory_cap_bytes),
    or the shards it keeps in host memory exceed topology.ddr_gib."""
    host_cap = topology.host_memory_cap_bytes
    over_host = [(r, s) for r, s in enumerate(used) if s.host_bytes > host_cap]
    if over_host:
        listed = "; ".join(f"rank {r} keeps {_gib(s.host_bytes)} in host memory" for r, s in over_host[:5])
        raise PlanInfeasibleError(
            f"{where}: {len(over_host)} rank(s) exceed the {_gib(host_cap)} of host memory a rank has for tables "
            f"(topology.ddr_gib={topology.ddr_gib:g}): {listed}{' ...' if len(over_host) > 5 else ''}. Fix: move shards "
            f"back to HBM or off these ranks, raise topology.ddr_gib")
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
