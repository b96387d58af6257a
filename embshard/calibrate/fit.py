"""Fit the cost model's calibrated terms to measurements.

The planner's predicted time of a rank's phase is linear in the terms it is fitted for:
1 / bandwidth for hbm_gb_per_s, intra_host_gb_per_s, inter_host_gb_per_s and dp_dense_gb_per_s, and every term of
Topology.CALIBRATED_TERMS (ns per unit of work, ms per call). So the design matrix is
built by the cost model itself: column k of a measured (plan, rank, phase) is what
`embshard.planner.cost.perf.rank_perfs` (the model `evaluate` reports and the search
minimises) says for that rank and phase on a topology where term k is one unit and every
other term is off. Fitting is then non-negative least squares on relative errors
(each row divided by its measured time plus FLOOR_MS), with each data source (kernel
microbenchmarks, collective microbenchmarks, plans run on ranks) weighted equally.
Sequence-only terms are fitted afterwards on the sequence samples, the shared terms fixed,
so the slower sequence paths cannot pull the pooled terms.

The in-host reduction's terms (HOST_REDUCE_TERMS) are fitted last (`host_reduce_fit`), on layouts run on
one host's ranks as 2+ hosts with and without the reduction: to what it adds to output dist. So are the
hierarchical all-reduce's (DP_HIER_TERMS, `dp_hier_fit`), on data-parallel layouts run hierarchically and
with one ring: to what it adds to the data-parallel all-reduce.

Then the per-phase factors (Topology.PHASE_FACTORS) scale the microbenchmark terms to what
the phases cost in whole steps on all ranks (measured plans): ranks running together share
caches, memory bandwidth and cores.

All topologies here are half duplex (full_duplex false): measurements are CPU time of
each rank, which pays for sending and receiving alike. Data-parallel tables train in the mode
each placement records (the kernel microbenchmarks measure both: "dp" replicated look-ups,
"allreduce" local look-ups with the dense full-table update, which dp_dense_gb_per_s prices);
placements without one are replicated look-ups (replicated_dp_lookup).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np
from scipy.optimize import nnls

from embshard.calibrate.measure import PHASES
from embshard.planner.cost.allreduce import flat_total_ms, hierarchical_total_ms
from embshard.planner.cost.perf import rank_perfs
from embshard.planner.cost.perf import allreduce_ms, spread_comm_ms
from embshard.planner.cost.traffic import allreduce_exchange_floats, wire_bytes
from embshard.planner.plan import ShardingPlan
from embshard.planner.types import ShardingType
from embshard.topology import CALIBRATED_TERMS, DP_HIER_TERMS, HOST_REDUCE_TERMS, PHASE_FACTORS, Topology

BANDWIDTHS = ("hbm_gb_per_s", "intra_host_gb_per_s", "inter_host_gb_per_s", "dp_dense_gb_per_s")
LINKS = ("intra_host_gb_per_s", "inter_host_gb_per_s")
TERMS = (*BANDWIDTHS, *CALIBRATED_TERMS)
UNIT_GB_PER_S = 1e-6  # a bandwidth of 1e-6 GB/s costs 1 ms per byte
FLOOR_MS = 0.5
FREE_GB_PER_S = 1e6  # stored when a bandwidth's cost fits to zero
LOOKUP_PHASES = ("lookup_fwd_ms", "lookup_bwd_ms")
DIST_PHASES = ("input_dist_ms", "output_dist_fwd_ms", "output_dist_bwd_ms", "dp_allreduce_ms")
LOOKUP_TERMS = ("hbm_gb_per_s", "lookup_fwd_call_ms", "lookup_bwd_call_ms", "lookup_fwd_ns_per_id", "lookup_bwd_ns_per_id", "lookup_bwd_ns_per_row",
                "lookup_bwd_shared_ns_per_row", "lookup_bwd_shared_ns_per_row_byte", "lookup_ns_per_row_byte", "dp_fwd_ns_per_id", "dp_bwd_ns_per_id_byte", "dp_bwd_ns_per_row", "dp_dense_gb_per_s")
DIST_TERMS = ("intra_host_gb_per_s", "inter_host_gb_per_s", "collective_ms", "inter_host_collective_ms", "input_dist_call_ms", "output_dist_call_ms", "dist_ns_per_id", "dist_ns_per_bag", "dist_ns_per_byte")
SEQUENCE_TERMS = ("lookup_ns_per_out_byte", "sequence_bwd_ns_per_row", "sequence_dist_ns_per_id")
ROUNDS = 4


@dataclass(frozen=True)
class Sample:
    """A measured plan: its placements and topology, and per-rank measured CPU ms by phase."""

    plan: ShardingPlan
    measured: tuple[dict[str, float], ...]  # per rank: phase -> ms
    source: str  # "kernels" | "plans"


def unit_topology(base: Topology, term: str | None) -> Topology:
    """``base`` with every fitted term off (bandwidths infinite) and ``term`` at one unit."""
    values: dict[str, Any] = {t: (math.inf if t in BANDWIDTHS else 0.0) for t in TERMS}
    if term is not None:
        values[term] = UNIT_GB_PER_S if term in BANDWIDTHS else 1.0
    return replace(base, full_duplex=False, replicated_dp_lookup=True, **{f: 1.0 for f in PHASE_FACTORS}, **values)


def plan_rows(sample: Sample, phases: Sequence[str] = PHASES) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]:
    """Design rows (one per rank and phase), measured ms, and (source, phase) labels."""
    p = sample.plan
    columns = [rank_perfs(p.specs, unit_topology(p.topology, t), p.tables) for t in TERMS]
    X, y, labels = [], [], []
    for r, measured in enumerate(sample.measured):
        for phase in phases:
            X.append([getattr(col[r], phase) for col in columns])
            y.append(measured[phase])
            labels.append((sample.source, phase))
    return np.array(X), np.array(y), labels


def collective_rows(rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, list[tuple[str, str]]]:
    """Design rows of collective microbenchmarks (median over ranks of each point).

    A row's ``local_world_size`` (default: its world size, one host) says how its ranks sit
    on hosts: the bytes and peers on the rank's host cost intra-host bandwidth and
    collective_ms, those on other hosts inter-host bandwidth and collective_ms +
    inter_host_collective_ms. Rows that cross hosts are fitted to wall time: waiting on a
    slower link costs no CPU time."""
    points: dict[tuple[str, int, int, int], list[float]] = {}
    for row in rows:
        W = row["world_size"]
        L = row.get("local_world_size", W)
        points.setdefault((row["op"], W, L, row["bytes"]), []).append(row["wall_ms" if L < W else "cpu_ms"])
    X, y, labels = [], [], []
    for (op, W, L, nbytes), ms in sorted(points.items()):
        x = [0.0] * len(TERMS)
        for link in LINKS:
            topo = unit_topology(Topology(world_size=W, local_world_size=L, device="cpu"), link)
            # all-to-all: the rank sends and receives (W-1)/W of its buffer; all-reduce: allreduce_ms
            x[TERMS.index(link)] = 2 * spread_comm_ms(nbytes, topo) if op == "all_to_all" else allreduce_ms(nbytes, topo)
        steps = 1 if op == "all_to_all" else 2
        x[TERMS.index("collective_ms")] = (W - 1) * steps
        x[TERMS.index("inter_host_collective_ms")] = (W - L) * steps
        X.append(x)
        y.append(statistics.median(ms))
        labels.append(("collectives", op))
    return np.array(X), np.array(y), labels


def to_topology(base: Topology, theta: dict[str, float], factors: dict[str, float] | None = None) -> Topology:
    """``base`` with fitted coefficients (bandwidths from ms per byte, terms as fitted) and factors."""
    values: dict[str, Any] = {f: (factors or {}).get(f, 1.0) for f in PHASE_FACTORS}
    values["replicated_dp_lookup"] = True
    for t in TERMS:
        c = theta.get(t, 0.0)
        values[t] = (1.0 / (c * 1e6) if c > 0 else FREE_GB_PER_S) if t in BANDWIDTHS else c
    return replace(base, full_duplex=False, **values)


@dataclass(frozen=True)
class Fit:
    theta: dict[str, float]  # coefficient per TERMS entry (ms per byte for bandwidths)
    factors: dict[str, float]  # PHASE_FACTORS
    errors: dict[str, dict[str, float]]  # source -> {"median": ..., "p90": ..., "n": ...} relative error

    def topology(self, base: Topology) -> Topology:
        return to_topology(base, self.theta, self.factors)





def _nnls(samples: Sequence[Sample], phases: Sequence[str], collectives: Sequence[dict[str, Any]], free: Sequence[str],
          fixed: dict[str, float], cache: dict | None = None) -> dict[str, float]:
    cache = {} if cache is None else cache
    blocks = []
    for s in samples:
        key = (id(s), tuple(phases))
        if key not in cache:
            cache[key] = plan_rows(s, phases)
        blocks.append(cache[key])
    if collectives:
        blocks.append(collective_rows(collectives))
    X = np.vstack([b[0] for b in blocks])
    y = np.concatenate([b[1] for b in blocks])
    sources = [lab[0] for b in blocks for lab in b[2]]
    counts = {s: sources.count(s) for s in set(sources)}
    w = np.array([1.0 / (yi + FLOOR_MS) / math.sqrt(counts[s]) for yi, s in zip(y, sources)])
    fixed_vec = np.array([0.0 if t in free else fixed.get(t, 0.0) for t in TERMS])
    cols = [TERMS.index(t) for t in free]
    coef, _ = nnls(X[:, cols] * w[:, None], (y - X @ fixed_vec) * w)
    return {**{t: fixed.get(t, 0.0) for t in TERMS}, **{t: float(c) for t, c in zip(free, coef)}}


def fit(samples: Sequence[Sample], collectives: Sequence[dict[str, Any]], fixed: dict[str, float] | None = None,
        host_reduce: Sequence[tuple[Sample, Sample]] = (), dp_hier: Sequence[tuple[Sample, Sample]] = ()) -> Fit:
    """Fit the terms on the microbenchmarks, then the per-phase factors on the plans.

    Terms (TERMS, except those in ``fixed``), on the kernel samples and the collectives, in
    three least-squares steps, each with the others' terms held: LOOKUP_TERMS on the lookup
    phases, DIST_TERMS on the other phases and the collectives (both without sequence
    tables), SEQUENCE_TERMS on the sequence samples; the steps repeat ROUNDS times. Factors (PHASE_FACTORS): for each phase, the
    least-squares ratio of measured to predicted time over the ranks of the plan samples
    (1 where no plan exercises the phase).
    """
    fixed = dict(fixed or {})
    micro = [s for s in samples if s.source != "plans"]
    pooled = [s for s in micro if all(t.pooled for t in s.plan.specs)]
    sequence = [s for s in micro if not all(t.pooled for t in s.plan.specs)]
    theta = {t: fixed.get(t, 0.0) for t in TERMS}
    steps = ((pooled, LOOKUP_PHASES, [], LOOKUP_TERMS), (pooled, DIST_PHASES, collectives, DIST_TERMS),
             (sequence, PHASES, [], SEQUENCE_TERMS))
    cache: dict = {}  # design rows do not depend on theta: build them once
    for _ in range(ROUNDS if sequence else 1):  # the steps share a few terms (output bytes): alternate
        for data, phases, colls, terms in steps:
            free = [t for t in terms if t not in fixed]
            if (data or colls) and free:
                theta = _nnls(data, phases, colls, free, theta, cache)
    factors = phase_factors([s for s in samples if s.source == "plans"], theta)
    free = [t for t in HOST_REDUCE_TERMS if t not in fixed]
    if host_reduce and free:
        theta = host_reduce_fit(host_reduce, theta, factors, free)
    free = [t for t in DP_HIER_TERMS if t not in fixed]
    if dp_hier and free:
        theta = dp_hier_fit(dp_hier, theta, factors, free)
    return Fit(theta, factors, fit_errors(samples, collectives, theta, factors))


HOST_REDUCE_PHASES = ("output_dist_fwd_ms", "output_dist_bwd_ms")


def host_reduce_fit(pairs: Sequence[tuple[Sample, Sample]], theta: dict[str, float], factors: dict[str, float],
                    free: Sequence[str] = HOST_REDUCE_TERMS) -> dict[str, float]:
    """``theta`` with the in-host reduction's terms fitted on (with, without) pairs: one layout, its topology on 2+
    hosts, measured with the reduction and with ``reduce_in_host`` off. Measured on one host's ranks, where the
    'other hosts' are local ranks: inter-host bytes and peers cost what intra-host ones do. Non-negative least
    squares of the model's extra output-dist time with the reduction (its terms under output_dist_factor) to the
    measured extra, per rank and direction, each row relative to the rank's measured output dist with the reduction."""
    # the 'other host' is local ranks: their bytes cost what intra-host ones do, factored (the model does not factor
    # inter-host link time, so its rate carries output_dist_factor here; only output dist is fitted)
    local = {**theta, "inter_host_gb_per_s": theta["intra_host_gb_per_s"] * factors["output_dist_factor"], "inter_host_collective_ms": 0.0,
             **dict.fromkeys(HOST_REDUCE_TERMS, 0.0)}
    X, y = [], []
    for on, off in pairs:
        p = on.plan
        assert p.topology.reduces_in_host and not off.plan.topology.reduce_in_host, "pairs are (with, without) the reduction"
        t_on = to_topology(p.topology, local, factors)
        pred_on = rank_perfs(p.specs, t_on, p.tables)
        pred_off = rank_perfs(p.specs, replace(t_on, reduce_in_host=False), p.tables)
        units = [rank_perfs(p.specs, unit_topology(p.topology, t), p.tables) for t in free]
        for r, (m_on, m_off) in enumerate(zip(on.measured, off.measured)):
            w = 1.0 / (sum(m_on[ph] for ph in HOST_REDUCE_PHASES) + FLOOR_MS)
            for ph in HOST_REDUCE_PHASES:
                X.append([getattr(u[r], ph) * factors["output_dist_factor"] * w for u in units])
                y.append(((m_on[ph] - m_off[ph]) - (getattr(pred_on[r], ph) - getattr(pred_off[r], ph))) * w)
    coef, _ = nnls(np.array(X), np.array(y))
    return {**theta, **{t: float(c) for t, c in zip(free, coef)}}


def dp_allreduce_bytes(plan: ShardingPlan) -> list[float]:
    """Bytes each data-parallel table of ``plan`` trained by all-reduce puts in the buffer, on the wire, as
    `embshard.planner.cost.perf.allreduce_perf` prices it (per table)."""
    by_name, topo = {s.name: s for s in plan.specs}, plan.topology
    return [allreduce_exchange_floats(by_name[t.name], topo) * wire_bytes(topo, "dp_allreduce") for t in plan.tables
            if t.sharding_type is ShardingType.DATA_PARALLEL and (t.data_parallel_mode or topo.data_parallel_mode) == "allreduce"]


def dp_hier_fit(pairs: Sequence[tuple[Sample, Sample]], theta: dict[str, float], factors: dict[str, float],
                free: Sequence[str] = DP_HIER_TERMS) -> dict[str, float]:
    """``theta`` with the hierarchical all-reduce's CPU terms fitted on (hierarchical, ring) pairs: one data-parallel
    layout on 2+ hosts, measured with ``reduce_in_host`` on (the runtime all-reduces hierarchically) and off (one
    ring). Measured on one host's ranks: the 'other hosts' are local ranks, their bytes and peers cost what intra-host
    ones do. Non-negative least squares of the model's extra dp_allreduce time of the hierarchy over the ring (per
    table, under dp_allreduce_factor) to the measured extra, per rank, relative to the rank's hierarchical dp_allreduce."""
    local = {**theta, "inter_host_gb_per_s": theta["intra_host_gb_per_s"], "inter_host_collective_ms": 0.0, **dict.fromkeys(DP_HIER_TERMS, 0.0)}
    f = factors["dp_allreduce_factor"]
    X, y = [], []
    for on, off in pairs:
        p = on.plan
        assert p.topology.reduces_in_host and not off.plan.topology.reduce_in_host, "pairs are (hierarchical, ring)"
        topo = to_topology(p.topology, local)
        sizes = dp_allreduce_bytes(p)
        model_extra = f * sum(hierarchical_total_ms(b, topo) - flat_total_ms(b, topo) for b in sizes)
        units = {"dp_hier_ns_per_byte": f * sum(sizes) * 1e-6, "dp_hier_call_ms": f * len(sizes)}
        for m_on, m_off in zip(on.measured, off.measured):
            w = 1.0 / (m_on["dp_allreduce_ms"] + FLOOR_MS)
            X.append([units[t] * w for t in free])
            y.append(((m_on["dp_allreduce_ms"] - m_off["dp_allreduce_ms"]) - model_extra) * w)
    coef, _ = nnls(np.array(X), np.array(y))
    return {**theta, **{t: float(c) for t, c in zip(free, coef)}}


FACTOR_PHASES = {"input_dist_factor": ("input_dist_ms",), "lookup_fwd_factor": ("lookup_fwd_ms",),
                 "output_dist_factor": ("output_dist_fwd_ms", "output_dist_bwd_ms"), "lookup_bwd_factor": ("lookup_bwd_ms",),
                 "dp_allreduce_factor": ("dp_allreduce_ms",)}


def phase_factors(samples: Sequence[Sample], theta: dict[str, float]) -> dict[str, float]:
    """Per phase: f minimising sum ((measured - f predicted) / rank's measured step)^2 over ranks,
    so phases weigh by their share of the step time that the planner minimises."""
    num = dict.fromkeys(PHASE_FACTORS, 0.0)
    den = dict.fromkeys(PHASE_FACTORS, 0.0)
    for s in samples:
        topo = to_topology(s.plan.topology, theta)
        for pred, meas in zip(rank_perfs(s.plan.specs, topo, s.plan.tables), s.measured):
            w = 1.0 / (sum(meas[p] for p in PHASES) + FLOOR_MS) ** 2
            for factor, phases in FACTOR_PHASES.items():
                for phase in phases:
                    p, m = getattr(pred, phase), meas[phase]
                    num[factor] += w * p * m
                    den[factor] += w * p * p
    return {f: (num[f] / den[f] if den[f] > 0 and num[f] > 0 else 1.0) for f in PHASE_FACTORS}


def fit_errors(samples: Sequence[Sample], collectives: Sequence[dict[str, Any]], theta: dict[str, float],
               factors: dict[str, float] | None = None) -> dict[str, dict[str, float]]:
    """Relative error of per-rank totals (plans, kernels) and of collective times, by source."""
    errors: dict[str, list[float]] = {}
    for s in samples:
        topo = to_topology(s.plan.topology, theta, factors if s.source == "plans" else None)
        for pred, meas in zip(rank_perfs(s.plan.specs, topo, s.plan.tables), s.measured):
            total = sum(meas[p] for p in PHASES)
            errors.setdefault(s.source, []).append(abs(pred.total_ms - total) / total)
    if collectives:
        X, y, _ = collective_rows(collectives)
        vec = np.array([theta.get(t, 0.0) for t in TERMS])
        errors["collectives"] = list(np.abs(X @ vec - y) / y)
    return {src: {"median": float(np.median(v)), "p90": float(np.quantile(v, 0.9)), "n": len(v)} for src, v in errors.items()}
