"""Planner entry points: `plan` searches, `evaluate` and `manual_plan` cost a given layout.

    from embshard.planner import plan
    p = plan(specs, Topology(world_size=64, local_world_size=8, hbm_gib=16))
    p.save("plan.json")

Every plan's per-rank report comes from `evaluate`, so a searched plan, a hand-made one and
one imported from TorchRec are scored by exactly the same code.
"""

from __future__ import annotations

import functools
import gc
import math
import time
from dataclasses import replace
from typing import Mapping, Sequence

from embshard.comms import CommsPrecision
from embshard.planner.cost.hot_rows import hot_split
from embshard.planner.cost.perf import dp_mode_of, rank_perfs
from embshard.planner.dp_modes import choose_data_parallel_modes
from embshard.planner.enumerate import forward_only
from embshard.planner.footprint import check_planner_memory
from embshard.planner.memory import PlanInfeasibleError, check_caps, check_memory, fragmentation_message
from embshard.planner.cost.storage import data_parallel_storage, holder_storage, requester_storage
from embshard.planner.cost.tiers import cache_rows
from embshard.planner.plan import RankReport, Replicas, ShardingPlan, TablePlacement, input_hash, validate_placements
from embshard.planner.search.bound import Bound, lower_bound_ms, quick_bound_ms, solve_bound
from embshard.planner.search.caches import grow_caches, tiers_first
from embshard.planner.search.clock import Clock
from embshard.planner.search.ilp import improve_with_ilp
from embshard.planner.search.greedy import Unplaceable, default_order, greedy_retrying, replication_prepass
from embshard.planner.search.local import Polisher, local_search
from embshard.planner.search.pack import rounds_needed, target_pack
from embshard.planner.search.problem import Problem, build_problem
from embshard.planner.search.row_order import rank_order_rows
from embshard.planner.search.state import RankState
from embshard.planner.splits import col_splits, row_splits
from embshard.planner.types import COMPUTE_KERNEL, Constraints, Location, Shard, ShardingType, Storage
from embshard.specs import TableSpec
from embshard.topology import Topology


GOOD_ENOUGH_GAP = 0.02  # a plan this close to the lower bound ends the search early
BOUND_SHARE = 0.5  # of the time left after enumeration, the most the LP bound may take
# the LP bound is not started with less time than this share of the enumeration time: it takes 0.8 to 0.9 of it
# (1,000 x 256 to 5,000 x 1,024), so it would run out of time, and the quick bound is reported either way
BOUND_MIN_SHARE = 0.5
ENUMERATE_SHARE = 0.5  # of the budget, after which tables still to enumerate get no split candidates


def _without_cycle_collection(fn):
    """fn with Python's cyclic garbage collector paused while it runs (as it was if the caller paused it).
    Planning allocates and frees millions of small objects (candidates, costs, search states) that hold no
    reference cycles, so refcounting frees them all; the collector's passes, triggered by the allocation
    counts, find nothing, yet each full pass walks every object of the process: 0.1 to 0.25 CPU s with torch
    and torchrec imported (373,000 objects; criteo_tb_measured tiered plans in about 0.15 s)."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return run


@_without_cycle_collection
def plan(specs: Sequence[TableSpec], topology: Topology, constraints: Constraints | None = None, *,
         time_budget_s: float = 10.0, use_ilp: bool = False, ilp_time_s: float = 1.0,
         torchrec_compatible: bool = False, inference: bool = False, comms: CommsPrecision | None = None,
         hot_ids_file: str = "") -> ShardingPlan:
    """Search a placement minimising the slowest rank's predicted step time under memory caps.

    Enumeration, the bound, greedy starts and a target-packing bisection (each polished by
    local search) and the report end within `time_budget_s` plus a margin (0.5 s + 10% of it:
    `embshard.planner.search.clock`; the LP bound gets no more time than leaves a whole greedy pass
    its own, and is not started with less than BOUND_MIN_SHARE of the enumeration time, when the
    quick bound is reported): stages that would not fit are skipped and named
    in the plan's ``search`` block (``skipped``, with ``stages_s``), the search stops with its
    best plan so far, and a greedy pass still running at the deadline places the remaining
    tables without host-bound layouts. Then, for problems small enough and plans more than 1% above the LP
    bound, an exact MILP runs for up to `ilp_time_s` more, which may improve the plan and
    tighten the bound (off by default: on the shipped workloads it costs seconds and has not
    beaten the heuristics). torchrec_compatible restricts layouts to those TorchRec's runtime
    can run (row_wise over all ranks, table_row_wise over whole hosts), so the plan exports
    with embshard.interop.torchrec. inference plans for serving: forward-only time (input
    dist, lookup forward, output dist) and memory (weights in each table's dtype, fp32 outputs;
    no optimizer state, gradients or backward buffers); the plan's ``search`` says so. With
    ``topology.ddr_gib`` the search also chooses each table's location (hbm, uvm_cache with a cache
    size, host) under HBM and host-memory caps (embshard.planner.cost.tiers), from one more start
    that places the tables that may leave HBM out of it first (`tiers_first`), and then gives the HBM
    it left to those tables (better tiers on any ranks, none above the maximum; embshard.planner.search.caches). Each
    start's local search is a descent, then kicks where they may pay (`local.Polisher`; the plan's ``search`` counts
    the ``starts_not_kicked``), and a rebalancing of the ranks' hidden holder side and replicas (``rebalanced``:
    shards moved and replicas made shards, embshard.planner.search.rebalance), and kicks again from the rebalanced plan
    with the time left. The
    search is deterministic when it ends before the budget: the same inputs give the same plan.
    comms: the wire dtypes of embeddings, gradients and data-parallel gradients (``planner.comms``);
    priced by the cost model and recorded in the plan's topology (None: the topology's, fp32 by default).
    hot_ids_file (embshard-stats hot_ids=): tables with a measured ``hot_rows`` curve are also offered
    hot-row replication (embshard/planner/cost/hot_rows.py); the plan records each table's choice
    (``hot_rows``, 0 where it does not pay) and the file.
    """
    if comms is not None:
        if topology.comms not in (CommsPrecision(), comms):
            raise ValueError(f"plan: comms={comms} but the topology says {topology.comms}; set the wire dtypes in one place "
                             "(planner.comms.*)")
        topology = replace(topology, comms=comms)
    clock = Clock(time_budget_s)
    specs = tuple(specs)
    constraints = constraints or Constraints()
    _check_constraint_names(specs, constraints)
    check_planner_memory(len(specs), topology.world_size)
    problem = build_problem(specs, topology, constraints, torchrec_compatible, inference, clock.start + ENUMERATE_SHARE * time_budget_s,
                            hot_rows=bool(hot_ids_file))
    if problem.unsplit_for_time:
        clock.skip(f"splits of {problem.unsplit_for_time} tables (out of time in enumeration; they stay whole or "
                   "replicated, and the lower bound covers the layouts enumerated: a plan with their splits may beat it)")
    check_memory(problem)
    clock.reserve_report(clock.lap("enumerate"))
    bound_limit_s = clock.bound_limit_s(BOUND_SHARE)
    if bound_limit_s > 0 and bound_limit_s >= BOUND_MIN_SHARE * clock.enumerate_s:
        solved = solve_bound(problem, max(bound_limit_s, 0.05))
    else:  # it would run out of time: the search gets the time instead
        solved = Bound(quick_bound_ms(problem), False)
    bound = solved.ms
    if not solved.exact:
        clock.skip("LP bound (out of time; the quick bound is reported)")
    clock.lap("bound")
    good_enough = bound * (1 + GOOD_ENOUGH_GAP)
    polish = Polisher()
    state, method, greedy_s = _best_start(problem, clock, good_enough, solved.requester_ms, polish)
    if problem.host_cap_bytes and max(state.costs()) > good_enough:  # tables may leave HBM: also start from there
        if clock.left_s() > 2 * greedy_s:
            tiered = tiers_first(problem, clock.search_deadline, polish)
            clock.lap("tiers_first")
            if tiered is not None and max(tiered[0].costs()) < max(state.costs()):
                state, method = tiered[0], f"tiers-first greedy+local_search({tiered[1]} steps)"
        else:
            clock.skip("tiers-first start (out of time)")
    packed, rounds = None, 0
    # a packing round costs about one greedy pass, and its plan's polish about as much again: packing runs when its
    # rounds (`rounds_needed` from the bound to the best plan) and the polish fit the time left, else rebalancing and
    # kicks below get the time (5,000 x 1,024: 4.6 s of packing, 6 rounds, found nothing better and left no time to
    # rebalance, 33.03 ms against 32.42 rebalanced; 2,000 x 512: 6 rounds, 1.4 s, its plan the best, 10.68 ms)
    if max(state.costs()) > good_enough and clock.left_s() < (rounds_needed(bound, max(state.costs())) + 1) * greedy_s:
        clock.skip("target packing (out of time)")
    elif max(state.costs()) > good_enough:
        packed, rounds = target_pack(problem, default_order(problem), bound, max(state.costs()), clock.search_deadline)
        clock.lap("target_packing")
        if packed is None:
            clock.skip("target packing (out of time before a round finished)" if not rounds else
                       "target packing (no order of the tables packed into memory)")
    if packed is not None:
        packed, steps = polish(packed, clock.search_deadline)
        clock.lap("local_search")
        if max(packed.costs()) < max(state.costs()):
            state, method = packed, f"target packing({rounds} rounds)+local_search({steps} steps)"
    before_ms = max(state.costs())
    if before_ms > good_enough and clock.left_s() <= 0:
        clock.skip("rebalance (out of time)")
    elif before_ms > good_enough:  # the best plan, where its kicks ended
        state, steps = polish.rebalance(state, clock.search_deadline, 0)
        if max(state.costs()) < before_ms:
            method += f"+rebalance+local_search({steps} steps)"
        clock.lap("rebalance")
        # rebalanced, the plan is no longer where its kicks ended: kick again from there with the time left (5,000 x 1,024
        # with the splits of ADDED_SHARE: 31.41 and 31.47 ms after 259 and 23 steps of kicks, from 31.61 without)
        if max(state.costs()) < before_ms and max(state.costs()) > good_enough and clock.left_s() > 0:
            kicked_ms = max(state.costs())
            state, steps = local_search(state, clock.search_deadline, kick_first=True)
            if max(state.costs()) < kicked_ms:
                method += f"+kicks({steps} steps)"
            clock.lap("kicks")
    if use_ilp and max(state.costs()) > bound * 1.01:
        improved, ilp_bound, note = improve_with_ilp(problem, state, time.perf_counter() + ilp_time_s)
        if improved is not None:
            state = improved
        bound = max(bound, ilp_bound)
        method += f"+{note}"
        clock.lap("ilp")
    grown, finished = grow_caches(state, clock.end)  # a fast pass (a cost array per table moved): it may use the report's reserve
    if not finished:
        clock.skip("grow_caches (out of time; some tables out of HBM keep the cache the search chose)")
    if grown:
        method += f"+grow_caches({grown} tables)"
    clock.lap("grow_caches")
    if not rank_order_rows(state, clock.search_deadline):
        clock.skip("rank_order_rows (out of time; some row blocks are not in rank order)")
    clock.lap("rank_order_rows")
    placements = placements_of(problem, state)
    scored_ms = max(state.costs())
    # the search gave each replicated table its own cheaper mode: one group moved into the other may cost less
    regrouped, regrouped_ms = choose_data_parallel_modes(specs, topology, [replace(t, data_parallel_mode=None) if t.data_parallel_mode else t for t in placements],
                                                         inference, with_ms=True)
    if regrouped != placements:
        placements, method = regrouped, method + "+data_parallel_modes"
        scored_ms = regrouped_ms if regrouped_ms is not None else max(p.total_ms for p in rank_perfs(specs, topology, placements, inference))
    search = {"method": method, "torchrec_compatible": torchrec_compatible, "inference": inference, "scored_ms": scored_ms,
              "starts_not_kicked": polish.skipped,
              "rebalanced": {"moves": polish.moved, "unreplicated": polish.unreplicated}}
    result = evaluate(specs, topology, placements, constraints, lower_bound=bound, search=search, inference=inference,
                      hot_ids_file=hot_ids_file)
    assert math.isclose(result.max_rank_ms, scored_ms, rel_tol=1e-9, abs_tol=1e-12), \
        f"the returned plan costs {result.max_rank_ms} ms, the search scored {scored_ms} ms"
    flat_topology = cheaper_reduction(specs, topology, placements, result.max_rank_ms, inference)
    if flat_topology is not topology:  # flat where the reduction costs more than it saves
        result = evaluate(specs, flat_topology, placements, constraints, lower_bound=bound,
                          search={**search, "reduce_in_host": False}, inference=inference, hot_ids_file=hot_ids_file)
        search = result.search
    clock.lap("report")
    return replace(result, search={**search, **clock.block()})


def cheaper_reduction(specs: Sequence[TableSpec], topology: Topology, placements: Sequence[TablePlacement], step_ms: float,
                      inference: bool = False) -> Topology:
    """``topology`` (whose slowest rank takes ``step_ms`` with these placements), or its flat variant
    (``reduce_in_host`` false: no in-host reduction across hosts) where the cost model prices that faster."""
    if topology.reduces_in_host and _reduces_in_host(specs, placements):
        flat = replace(topology, reduce_in_host=False)  # priced only where something runs differently flat
        if max(p.total_ms for p in rank_perfs(specs, flat, placements, inference)) < step_ms:
            return flat
    return topology


def _reduces_in_host(specs: Sequence[TableSpec], placements: Sequence[TablePlacement]) -> bool:
    """Whether anything of these placements runs differently with the in-host reduction on (across hosts):
    pooled row-split outputs (reduced in the host first) or an all-reduce (data-parallel tables in the allreduce
    mode, hot rows), which may go hierarchical. Otherwise the flat variant costs the same, and is not priced."""
    by_name = {s.name: s for s in specs}
    return any((t.sharding_type.splits_rows and by_name[t.name].pooled) or dp_mode_of(t) == "allreduce" for t in placements)


def _best_start(problem: Problem, clock: Clock, good_enough: float,
                requester_floor_ms: tuple[float, ...] = (), polish: Polisher | None = None) -> tuple[RankState, str, float]:
    """Greedy + local search from up to three starts (replicate-first priced at the bound's projected
    requester side `requester_floor_ms`, replicate-first, and plain); keep the faster plan.

    The starts share half the time left, in that order. A later start is
    skipped when its greedy pass places every table as an earlier one did (on criteo_tb_measured the
    plain pass replicates the same tables), when the best is already within GOOD_ENOUGH_GAP of the bound, when its greedy
    pass would not fit the time left, or when the previous start's local search is still
    improving at the end of its share (it then goes on until the search deadline). Past the
    deadline a greedy pass finishes without host-bound layouts (named in the method). Returns the
    plan, the method and the first greedy pass's seconds.
    """
    order = default_order(problem)
    polish = polish or Polisher()
    best, best_obj, method, failure, greedy_s = None, float("inf"), "", None, 0.0
    starts = [("greedy", None, ())]
    replicate = replication_prepass(problem)
    if replicate:  # first: on many ranks the requester side it saves dominates, and the second start may not fit the time
        starts.insert(0, ("replicate-first greedy", replicate, ()))
    if any(requester_floor_ms):  # first of all: on many ranks it starts lowest (greedy.greedy); not always, hence the others
        starts.insert(0, (f"{starts[0][0]} at the projected requester side", starts[0][1], requester_floor_ms))
    deadline = time.perf_counter() + clock.left_s() / 2
    started = set()  # the greedy placements polished so far
    for i, (name, replicate, floor) in enumerate(starts):
        if best_obj <= good_enough:
            break
        if best is not None and time.perf_counter() + greedy_s > deadline:
            clock.skip(f"{name} start (out of time)")
            continue
        try:
            state = greedy_retrying(problem, order, replicate, clock.greedy_deadline, requester_floor_ms=floor)
        except Unplaceable as e:
            failure = e
            state = None
        took = clock.lap("greedy")
        greedy_s = greedy_s or took
        if state is None or tuple(state.choice) in started:  # the same start polishes to the same plan
            continue
        started.add(tuple(state.choice))
        now = time.perf_counter()
        ls_deadline = now + (deadline - now) / (len(starts) - i)
        if clock.left_s() < 3 * greedy_s:  # no time for another pass and its polish: this start's search takes all of it
            ls_deadline = clock.search_deadline
        state, steps = polish(state, ls_deadline)
        still_improving = time.perf_counter() >= ls_deadline and i + 1 < len(starts)
        if still_improving:  # cut short while it improves: it keeps the time the next start would take
            state, more = local_search(state, clock.search_deadline)
            steps += more
            clock.skip(f"{starts[i + 1][0]} start (out of time: the {name} start's local search was still improving)")
        clock.lap("local_search")
        obj = max(state.costs())
        if obj < best_obj:
            rushed = f" ({state.rushed} units without host-bound layouts, out of time)" if state.rushed else ""
            best, best_obj, method = state, obj, f"{name}{rushed}+local_search({steps} steps)"
        if still_improving:
            break
    if best is None:
        raise PlanInfeasibleError(fragmentation_message(problem, failure.unit_index))
    return best, method, greedy_s


def evaluate(specs: Sequence[TableSpec], topology: Topology, placements: Sequence[TablePlacement],
             constraints: Constraints | None = None, *, lower_bound: float | None = None,
             search: Mapping | None = None, inference: bool = False, hot_ids_file: str = "") -> ShardingPlan:
    """Cost a placement with embshard's model (`embshard.planner.cost.perf.rank_perfs`, what the
    search minimises): per-rank perf by phase, memory, lower bound. PlanInfeasibleError if a
    rank's shards and buffers exceed its memory cap (`embshard.planner.memory.check_caps`).
    Data-parallel placements without a mode get the cheaper ones (`choose_data_parallel_modes`).
    Placements with hot_rows need the hot_ids_file that names their hot ids."""
    specs = tuple(specs)
    constraints = constraints or Constraints()
    validate_placements(placements, specs, topology, "placements")
    by_name = {s.name: s for s in specs}
    placements = choose_data_parallel_modes(specs, topology, placements, inference)
    W = topology.world_size
    storage, every_storage = [Storage()] * W, Storage()
    for t in placements:
        spec = by_name[t.name]
        if t.sharding_type is ShardingType.DATA_PARALLEL:
            every_storage = every_storage + data_parallel_storage(spec, topology, inference, t.data_parallel_mode)
            continue
        if t.hot_rows:  # the cold part as sharded, the hot rows' replica on every rank
            spec, hot = hot_split(spec, t.hot_rows)
            every_storage = every_storage + data_parallel_storage(hot, topology, inference, "allreduce")
        every_storage = every_storage + requester_storage(spec, topology, inference)
        for s in t.shards:
            storage[s.rank] = storage[s.rank] + holder_storage(spec, topology, t.sharding_type, s.num_rows, s.num_cols,
                                                               inference, s.location, s.cache_rows)
    used = [s + every_storage for s in storage]
    check_caps(used, topology)
    perfs = [forward_only(p) if inference else p for p in rank_perfs(specs, topology, placements, inference)]
    ranks = tuple(RankReport(r, perfs[r], used[r]) for r in range(W))
    hot = [t.name for t in placements if t.hot_rows]
    if hot and not hot_ids_file:
        raise ValueError(f"placements: tables {hot} have hot_rows but no hot_ids_file names their hot ids; "
                         "give the file embshard-stats hot_ids= wrote")
    if lower_bound is None:
        problem = build_problem(specs, topology, constraints, inference=inference, hot_rows=bool(hot_ids_file))
        check_memory(problem)
        lower_bound = lower_bound_ms(problem)[0]
    return ShardingPlan(
        tables=tuple(placements), specs=specs, topology=topology, ranks=ranks, lower_bound_ms=lower_bound,
        input_hash=input_hash(specs, topology, repr(constraints) + (f"; hot_ids_file={hot_ids_file}" if hot_ids_file else "")),
        search=dict(search or {"method": "evaluated"}),
        hot_ids_file=hot_ids_file,
    )


def manual_plan(specs: Sequence[TableSpec], topology: Topology,
                layout: Mapping[str, tuple[ShardingType | str, Sequence[int]]]) -> ShardingPlan:
    """A plan from a hand-made layout: table -> (sharding type, ranks in shard order).

    Rows and columns are cut as the planner cuts them (embshard.planner.splits); a
    data-parallel table's ranks are ignored (it lives on every rank).
    """
    specs = tuple(specs)
    missing = sorted({s.name for s in specs} - set(layout))
    if missing:
        raise ValueError(f"layout: no entry for table(s) {missing}; give every table (type, ranks)")
    placements = []
    for spec in specs:
        raw_type, ranks = layout[spec.name]
        stype = ShardingType.parse(raw_type if isinstance(raw_type, str) else raw_type.value, f"layout.{spec.name}")
        placements.append(placement_for(spec, topology, stype, tuple(ranks)))
    return evaluate(specs, topology, placements)


def placement_for(spec: TableSpec, topology: Topology, stype: ShardingType, ranks: tuple[int, ...]) -> TablePlacement:
    N, D = spec.num_embeddings, spec.embedding_dim
    if stype is ShardingType.DATA_PARALLEL:
        shards = Replicas(topology.world_size, N, D)
    elif stype.splits_rows:
        spans = row_splits(N, len(ranks))
        if spans is None:
            raise ValueError(f"layout.{spec.name}: {N} rows cannot be cut into {len(ranks)} non-empty row blocks of ceil(rows/k); use fewer ranks")
        shards = tuple(Shard(r, ro, n, 0, D) for r, (ro, n) in zip(ranks, spans))
    elif stype.splits_cols:
        spans = col_splits(D, len(ranks))
        if spans is None:
            raise ValueError(f"layout.{spec.name}: dim {D} cannot be cut into {len(ranks)} column blocks of multiples of 4")
        shards = tuple(Shard(r, 0, N, co, d) for r, (co, d) in zip(ranks, spans))
    else:
        if len(ranks) != 1:
            raise ValueError(f"layout.{spec.name}: table_wise takes exactly one rank, got {list(ranks)}")
        shards = (Shard(ranks[0], 0, N, 0, D),)
    return TablePlacement(spec.name, stype, COMPUTE_KERNEL[stype], shards)


def placements_of(problem: Problem, state: RankState) -> list[TablePlacement]:
    out = []
    for ui, unit in enumerate(problem.units):
        ci, ranks = state.choice[ui]
        cv = unit.cands[ci]
        for table, cand in zip(unit.tables, cv.cand):
            if cv.data_parallel:
                shards = Replicas(problem.topo.world_size, table.num_embeddings, table.embedding_dim)
            else:  # block i on ranks[i], as the search scored it (the runtime routes rows by offset)
                assert not (problem.rank_ordered_rows and cand.sharding_type.splits_rows) or list(ranks) == sorted(ranks)
                shards = tuple(Shard(r, b.row_offset, b.num_rows, b.col_offset, b.num_cols, cand.location,
                                     cache_rows(b.num_rows, cand.cache_fraction) if cand.location is Location.UVM_CACHE else 0)
                               for r, b in zip(ranks, cand.blocks))
            out.append(TablePlacement(table.name, cand.sharding_type, COMPUTE_KERNEL[cand.sharding_type], shards,
                                      hot_rows=cand.hot_rows, data_parallel_mode=cand.data_parallel_mode))
    return out


def _check_constraint_names(specs: tuple[TableSpec, ...], constraints: Constraints) -> None:
    names = {s.name for s in specs}
    for n in list(constraints.tables) + [n for g in constraints.keep_together for n in g]:
        if n not in names:
            raise ValueError(f"constraints: no table named {n!r}; constraints must name tables from the tables list")
