"""The data-parallel mode of each replicated table of a plan, chosen at plan level.

Each table gets its cheaper mode alone (`embshard.planner.cost.perf.cheaper_data_parallel_mode`);
a collection then pays each mode group it runs once more (its kernels, and its all-reduce or its
own input dist: `embshard.planner.cost.perf.mode_group_perf`), which no table's choice alone sees.
So the per-table choice is compared with every chosen table in one mode, then the other, by the
plan's objective (the slowest rank of `rank_perfs`, what the search minimises); the cheaper single
mode is kept unless the mix of both saves more than `MIX_MIN_SAVING` of it (below: the model cannot
tell a smaller saving from the runtime cost of a second group). `embshard.planner.plan` does so after
its search, `evaluate` for placements given without modes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from embshard.planner.cost.perf import cheaper_data_parallel_mode, rank_perfs
from embshard.planner.types import ShardingType
from embshard.specs import TableSpec
from embshard.topology import DATA_PARALLEL_MODES, Topology

# The share of the step a mix of both modes must save over the cheaper single mode. The runtime benchmark's
# data-parallel case (8 tables, 2 ranks x 2,048): a mix predicted 1.1% faster (cpu_gloo_measured) ran 2% and 18% slower
# than all replicated_lookup (b682d32 and 9dbb23f), one predicted 1.8% faster (tests/planner/data/cpu_gloo_dense.yaml)
# 5% slower; its `sizes` case, a mix predicted 8.8% faster, ran 13% faster.
MIX_MIN_SAVING = 0.03


def choose_data_parallel_modes(specs: Sequence[TableSpec], topo: Topology, placements: Sequence,
                               inference: bool = False, with_ms: bool = False):
    """placements (TablePlacement-like) with a mode for every data-parallel one that has none; recorded modes are kept.
    With ``with_ms``, (placements, their objective), the objective None where a single option was not priced."""
    by_name = {s.name: s for s in specs}
    free = {t.name for t in placements if t.sharding_type is ShardingType.DATA_PARALLEL and t.data_parallel_mode is None}
    if not free:
        return (list(placements), None) if with_ms else list(placements)
    per_table = {n: cheaper_data_parallel_mode(by_name[n], topo, inference) for n in free}
    options = [per_table]
    # both groups: each moved into the other (not with sharded updates, where the modes' memory differs: the
    # per-table choice is what the search fitted into memory)
    if len(set(per_table.values())) > 1 and not topo.sharded_dp_update:
        options += [dict.fromkeys(free, mode) for mode in DATA_PARALLEL_MODES]
    best, best_ms = None, float("inf")
    for modes in options[::-1]:  # single modes first; the mix must beat them by MIX_MIN_SAVING
        chosen = [replace(t, data_parallel_mode=modes[t.name]) if t.name in free else t for t in placements]
        ms = max(p.total_ms for p in rank_perfs(specs, topo, chosen, inference)) if len(options) > 1 else 0.0
        if ms < best_ms * (1 - MIX_MIN_SAVING if modes is per_table else 1):
            best, best_ms = chosen, ms
    if with_ms:
        return best, best_ms if len(options) > 1 else None
    return best
