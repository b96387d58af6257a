"""Bad input on one rank: every rank must raise a ValueError naming the feature and the value,
and the group must stay usable (no rank left inside a collective)."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.distributed as dist

from embshard.planner.types import ShardingType
from rt_reference import kjt
from rt_training import POOLED, SEQUENCE, features_of, make_batches, make_collection, make_plan, topology

ST = ShardingType
MIXED = [ST.ROW_WISE, ST.COLUMN_WISE, ST.TABLE_WISE, ST.DATA_PARALLEL]


def _expect_error(build: Callable[[], object], run: Callable[[object], object] | None, expect: list[str],
                  recover: Callable[[], object] | None, pg: dist.ProcessGroup) -> dict:
    """Run ``build`` (and ``run`` on its result); record whether ValueError was raised with ``expect`` in it."""
    result = {"raised": False, "message": "", "expect": expect, "recovered": recover is None}
    try:
        module = build()
        if run is not None:
            run(module)
    except ValueError as e:
        result["raised"], result["message"] = True, str(e)
    if recover is not None:
        recover()
        result["recovered"] = True
    dist.barrier(group=pg)
    return result


def _bad_batch_case(world_size: int, bad_rank: int, edit: Callable[[dict], None], expect: list[str], pooled: bool = True,
                    weighted_collection: bool = False, strip_weights: bool = False,
                    types: list[ShardingType] = MIXED) -> Callable[[dist.ProcessGroup], dict]:
    specs = POOLED if pooled else SEQUENCE
    plan = make_plan(specs, topology(world_size), types)
    feats = features_of(specs)

    def case(pg: dist.ProcessGroup) -> dict:
        rank = dist.get_rank(pg)
        collection = make_collection(specs, plan, pg, pooled, weighted=weighted_collection)
        good = make_batches(specs, world_size, weighted_collection, seed=21)[0][rank]
        bad = dict(good)
        if rank == bad_rank:
            edit(bad)
        weighted = weighted_collection and not (strip_weights and rank == bad_rank)
        return _expect_error(lambda: collection, lambda c: c(kjt(bad, [f for f in feats if f in bad] + [f for f in bad if f not in feats], weighted)),
                             expect, lambda: collection(kjt(good, feats, weighted_collection)), pg)
    return case


def _set_id(feature: str, value: int) -> Callable[[dict], None]:
    def edit(batch: dict) -> None:
        lengths, ids, weights = batch[feature]
        lengths = lengths.clone()
        lengths[-1] += 1
        batch[feature] = (lengths, torch.cat([ids, torch.tensor([value])]),
                          None if weights is None else torch.cat([weights, torch.ones(1)]))
    return edit


def _drop(feature: str) -> Callable[[dict], None]:
    return lambda batch: batch.pop(feature)


def _add(feature: str) -> Callable[[dict], None]:
    def edit(batch: dict) -> None:
        B = len(next(iter(batch.values()))[0])
        batch[feature] = (torch.ones(B, dtype=torch.int64), torch.zeros(B, dtype=torch.int64), None)
    return edit


def _plan_mismatch(world_size: int) -> Callable[[dist.ProcessGroup], dict]:
    plan = make_plan(POOLED, topology(world_size), MIXED)
    wrong = [dataclasses.replace(POOLED[2], num_embeddings=24), *POOLED[:2], POOLED[3]]

    def case(pg: dist.ProcessGroup) -> dict:
        return _expect_error(lambda: make_collection(wrong, plan, pg, True), None, ["'tc'", "num_embeddings", "24", "23"], None, pg)
    return case


def _plan_differs_on_one_rank(world_size: int) -> Callable[[dist.ProcessGroup], dict]:
    plan = make_plan(POOLED, topology(world_size), MIXED)
    other = make_plan(POOLED, topology(world_size), [ST.TABLE_WISE] * 4)

    def case(pg: dist.ProcessGroup) -> dict:
        mine = other if dist.get_rank(pg) == world_size - 1 else plan
        return _expect_error(lambda: make_collection(POOLED, mine, pg, True), None, ["different plans"], None, pg)
    return case


def _wrong_world_size(world_size: int) -> Callable[[dist.ProcessGroup], dict]:
    plan = make_plan(POOLED, topology(world_size + 1) if world_size < 4 else topology(2), MIXED)

    def case(pg: dist.ProcessGroup) -> dict:
        return _expect_error(lambda: make_collection(POOLED, plan, pg, True), None, ["ranks", str(world_size)], None, pg)
    return case


def cases(world_size: int) -> dict[str, Callable[[dist.ProcessGroup], dict]]:
    last = world_size - 1
    return {
        "bad-id-too-large": _bad_batch_case(world_size, last, _set_id("c", 23), ["'c'", "23", "[0, 23)"]),
        "bad-id-negative": _bad_batch_case(world_size, 0, _set_id("a2", -1), ["'a2'", "-1"]),
        "bad-id-sequence": _bad_batch_case(world_size, last, _set_id("s4", 1000), ["'s4'", "1000"], pooled=False),
        "bad-missing-feature": _bad_batch_case(world_size, 0, _drop("d"), ["missing", "'d'"]),
        # all look-ups local (the header is read after them): every rank still raises
        "bad-id-local-only": _bad_batch_case(world_size, last, _set_id("c", 23), ["'c'", "23"], types=[ST.DATA_PARALLEL] * 4),
        "bad-id-local-only-sequence": _bad_batch_case(world_size, 0, _set_id("s4", 1000), ["'s4'", "1000"], pooled=False,
                                                      types=[ST.DATA_PARALLEL] * 4),
        "bad-unknown-feature": _bad_batch_case(world_size, 1, _add("zz"), ["unknown", "'zz'"]),
        "bad-missing-weights": _bad_batch_case(world_size, last, lambda b: None, ["weights"], weighted_collection=True,
                                               strip_weights=True),
        "bad-plan-mismatch": _plan_mismatch(world_size),
        "bad-plan-differs-on-one-rank": _plan_differs_on_one_rank(world_size),
        "bad-plan-world-size": _wrong_world_size(world_size),
    }
