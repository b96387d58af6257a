"""The enumeration (enumerate.py and search.problem's flattening) equals a straightforward reference:
every candidate of every unit, on random small instances with every sharding type, pooled and
sequence tables, tiers, hot rows, calibrated kernel costs, serving, pins and keep_together, has
exactly the costs the cost model gives each block priced on its own (no sharing of equal blocks, no
reuse of the table_wise candidate), and flattens to exactly the vectors a per-shard loop gives.
Floats compare with ==: a cost that changes by one ulp fails."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from embshard.cli import CONFIG_DIR
from embshard.planner.cost.hot_rows import hot_split
from embshard.planner.cost.perf import cheaper_data_parallel_mode, data_parallel_perf, holder_perf, requester_perf
from embshard.planner.cost.storage import data_parallel_storage, holder_storage, requester_storage
from embshard.planner.cost.tiers import cache_rows
from embshard.planner.enumerate import forward_only
from embshard.planner.search.problem import build_problem, perf_vector
from embshard.planner.splits import col_splits
from embshard.planner.types import Candidate, Constraints, Location, Perf, ShardCost, ShardingType, TableConstraint
from embshard.topology import Topology
from embshard.workloads import generate_tables

CALIBRATED = Path(CONFIG_DIR) / "topology" / "cpu_gloo_measured.yaml"  # the package's (the wheel test runs these from it)
SKEWED = ((0.001, 0.3), (0.01, 0.6), (0.1, 0.9), (0.5, 0.99))


def reference_candidate(spec, topo, c: Candidate, inference: bool) -> Candidate:
    """c recomputed from the cost model: every block priced on its own."""
    phases = forward_only if inference else (lambda p: p)
    stype = c.sharding_type
    if c.hot_rows:
        cold, hot = hot_split(spec, c.hot_rows)
        base = reference_candidate(cold, topo, replace(c, hot_rows=0), inference)
        return replace(base, every_rank=phases(data_parallel_perf(hot, topo, inference, "allreduce")),
                       every_rank_storage=base.every_rank_storage + data_parallel_storage(hot, topo, inference, "allreduce"),
                       hot_rows=c.hot_rows)
    if stype is ShardingType.DATA_PARALLEL:
        mode, perf = cheaper_data_parallel_mode(spec, topo, inference, with_perf=True)
        return Candidate(spec.name, stype, (), (), (), Perf(), phases(perf),
                         data_parallel_storage(spec, topo, inference, mode), data_parallel_mode=mode)
    k = len(c.col_spans) if stype.splits_cols else len(c.row_spans)
    rows, cols = ((0, spec.num_embeddings),), ((0, spec.embedding_dim),)
    if stype.splits_rows:
        block = -(-spec.num_embeddings // k)  # every block but the last holds `block` rows
        rows = tuple((i * block, block) for i in range(k - 1)) + (((k - 1) * block, spec.num_embeddings - (k - 1) * block),)
    elif stype.splits_cols:
        cols = tuple(col_splits(spec.embedding_dim, k))
    shards = []
    for _, n in rows:
        for _, d in cols:
            cached = cache_rows(n, c.cache_fraction) if c.location is Location.UVM_CACHE else 0
            shards.append(ShardCost(phases(holder_perf(spec, topo, stype, n, d, k, c.location, cached)),
                                    holder_storage(spec, topo, stype, n, d, inference, c.location, cached)))
    return Candidate(spec.name, stype, rows, cols, tuple(shards), phases(requester_perf(spec, topo, stype, k)),
                     Perf(), requester_storage(spec, topo, inference), c.location, c.cache_fraction)


def reference_vectors(cands, specs, topo, inference):
    """The flattened shard vectors, costs, HBM and host bytes, requester vector, every-rank ms and bytes, per shard."""
    vecs, costs, mem, host = [], [], [], []
    for i in range(cands[0].num_shards):
        vec = tuple(map(sum, zip(*(perf_vector(c.shards[i].perf) for c in cands))))
        vecs.append(vec)
        costs.append(sum(vec))
        mem.append(sum(c.shards[i].storage.total_bytes for c in cands))
        host.append(sum(c.shards[i].storage.host_bytes for c in cands))
    req, every_ms, every_mem = [0.0, 0.0, 0.0], 0.0, 0
    for c, spec in zip(cands, specs):
        rv = perf_vector(c.requester)
        if topo.full_duplex:
            req = [a + b for a, b in zip(req, rv[:3])]
        else:
            every_ms += sum(rv[:3])
        every_ms += c.every_rank.total_ms
        every_mem += c.every_rank_storage.total_bytes - requester_storage(spec, topo, inference).total_bytes
    return tuple(vecs), tuple(costs), tuple(mem), tuple(host) if any(host) else (), tuple(req), every_ms, every_mem


def _calibrated(world_size: int, local: int) -> Topology:
    return Topology.from_dict({**yaml.safe_load(CALIBRATED.read_text()), "world_size": world_size, "local_world_size": local})


CASES = [  # (seed, topology, inference, torchrec_compatible, hot rows, constraints)
    (0, Topology(world_size=32, local_world_size=4, hbm_gib=1.0, batch_size_per_rank=256, device="cuda"), False, False, False, False),
    (1, Topology(world_size=16, local_world_size=4, hbm_gib=0.5, batch_size_per_rank=128, device="cuda", ddr_gib=4.0), False, False, True, True),
    (2, _calibrated(8, 4), False, False, True, True),
    (3, _calibrated(8, 4), True, False, False, False),
    (4, Topology(world_size=16, local_world_size=8, hbm_gib=2.0, batch_size_per_rank=64, device="cuda", ddr_gib=2.0), True, True, False, False),
]


@pytest.mark.parametrize("seed,topo,inference,torchrec_compatible,hot,constrained", CASES)
def test_enumeration_equals_reference(seed, topo, inference, torchrec_compatible, hot, constrained):
    specs = generate_tables(30, seed=seed, sequence_fraction=0.3)
    if hot:  # every third table with a measured access curve
        specs = tuple(replace(s, hot_rows=SKEWED) if i % 3 == 0 else s for i, s in enumerate(specs))
    constraints = Constraints()
    if constrained:  # one table pinned to two hosts' ranks, three kept together
        names = [s.name for s in specs]
        pinned = tuple(range(0, topo.world_size, 2))
        constraints = Constraints({names[1]: TableConstraint(ranks=pinned)}, keep_together=(tuple(names[4:7]),))
    problem = build_problem(specs, topo, constraints, torchrec_compatible, inference, hot_rows=hot)
    by_name = {s.name: s for s in specs}
    seen_types, seen_pooled = set(), set()
    for unit in problem.units:
        for cv in unit.cands:
            ref = tuple(reference_candidate(by_name[c.table], topo, c, inference) for c in cv.cand)
            assert cv.cand == ref, cv.label
            assert (cv.shard_vec, cv.shard_cost, cv.shard_mem, cv.shard_host_mem, cv.req_vec, cv.every_ms, cv.every_mem) == \
                reference_vectors(ref, unit.tables, topo, inference), cv.label
            seen_types.add(cv.cand[0].sharding_type)
            seen_pooled.add(unit.tables[0].pooled)
    assert seen_pooled == {True, False}
    if not torchrec_compatible:
        assert seen_types == set(ShardingType), seen_types  # every sharding type was checked


def test_factored_with_link_is_factored_plus_link():
    """_factored's link path (one Perf built) sums exactly as the factored Perf + link, on a calibrated profile."""
    from embshard.planner.cost.perf import _factored

    topo = replace(_calibrated(8, 4), input_dist_factor=1.3, lookup_fwd_factor=0.7, output_dist_factor=1.1,
                   lookup_bwd_factor=0.9, dp_allreduce_factor=1.7)
    p, link = Perf(0.1, 0.2, 0.3, 0.4, 0.5, 0.6), Perf(1 / 3, 1 / 7, 1 / 9, 1 / 11, 1 / 13, 1 / 17)
    assert _factored(p, topo, link) == _factored(p, topo) + link
    assert _factored(p, topo) == Perf(0.1 * 1.3, 0.2 * 0.7, 0.3 * 1.1, 0.4 * 1.1, 0.5 * 0.9, 0.6 * 1.7)
