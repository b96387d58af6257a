"""The search's Python paths on few ranks make the same steps as its array paths: `moves._try_move` on up to
PYTHON_MOVE_RANKS ranks (`_try_move_few`) picks the move the arrays pick, on every call local search makes, with
tiers (host-memory caps), host-bound layouts on two hosts and tables pinned to some ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

import embshard.planner.search.local as local
import embshard.planner.search.moves as moves
from embshard.cli import CONFIG_DIR
from embshard.planner.search.greedy import default_order, greedy_retrying
from embshard.planner.search.problem import build_problem
from embshard.planner.types import Constraints, TableConstraint
from embshard.specs import load_tables_file
from embshard.topology import Topology
from embshard.workloads import generate_tables

TABLES = Path(CONFIG_DIR) / "tables" / "criteo_tb_measured.yaml"


def _problems():
    tbm, _ = load_tables_file(TABLES)
    yield "criteo_tb_measured tiered, 8 ranks", tbm, Topology(world_size=8, local_world_size=8, hbm_gib=8.0, ddr_gib=64.0,
                                                               batch_size_per_rank=4096), Constraints(), 1
    yield "criteo_tb_measured tiered, 8 ranks x 4 GiB + 9 GiB", tbm, Topology(world_size=8, local_world_size=8, hbm_gib=4.0,
                                                                             ddr_gib=9.0, batch_size_per_rank=4096), Constraints(), 0
    gen = generate_tables(60, seed=3)
    pinned = Constraints(tables={s.name: TableConstraint(ranks=tuple(range(i % 4, 16, 2))) for i, s in enumerate(gen[:12])})
    yield "60 tables, 2 hosts x 8, 12 pinned", gen, Topology(world_size=16, local_world_size=8, hbm_gib=4.0), pinned, 1


@pytest.mark.parametrize("name,specs,topo,constraints,min_ties", list(_problems()), ids=lambda v: v if isinstance(v, str) else "")
def test_moves_on_few_ranks_are_the_array_paths_moves(name, specs, topo, constraints, min_ties, monkeypatch) -> None:
    """min_ties: moves among tied destinations at least (all three cases move; the tight one, where HBM and host memory
    rule out destinations, moves twice, without ties)."""
    assert topo.world_size <= moves.PYTHON_MOVE_RANKS
    array_path = moves._try_move
    calls = {"moves": 0, "ties": 0, "none": 0}

    def both(state, r, costs, by_cost=None):
        twin = state.copy()
        with monkeypatch.context() as m:
            m.setattr(moves, "PYTHON_MOVE_RANKS", 0)
            expected = array_path(twin, r, list(costs), by_cost)
        moved = array_path(state, r, costs, by_cost)  # (PYTHON_MOVE_RANKS as shipped: `_try_move_few`)
        assert moved == expected
        assert state.choice == twin.choice
        assert state.H == twin.H and state.mem == twin.mem
        calls["moves" if moved else "none"] += 1
        return moved

    def few(state, r, costs, held, rows, mem, host, by_cost):  # counts the calls that weigh tied destinations
        costs_after = state.costs_after
        def counted(vec):
            calls["ties"] += 1
            return costs_after(vec)
        state.costs_after = counted
        try:
            return few_path(state, r, costs, held, rows, mem, host, by_cost)
        finally:
            del state.costs_after

    few_path = moves._try_move_few
    monkeypatch.setattr(moves, "_try_move", both)
    monkeypatch.setattr(moves, "_try_move_few", few)
    problem = build_problem(tuple(specs), topo, constraints)
    state = greedy_retrying(problem, default_order(problem), None, float("inf"))
    local.local_search(state, float("inf"))
    assert calls["moves"] >= 2 and calls["none"] >= 2, calls  # (66 / 138, 2 / 13 and 81 / 96 calls here)
    assert calls["ties"] >= min_ties, calls
