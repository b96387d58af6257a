"""Memory of the dense (data-parallel) layers on each rank, which the planner keeps out of the
embedding shards' reach: fp32 weights and gradients on every rank (DDP), plus the dense
optimizer's state. A sharded update (``optim.sharded_update``: torch's ZeroRedundancyOptimizer)
keeps only this rank's share of that state: whole parameters, assigned largest first to the
rank holding the least so far (`zero_shares`, torch's own rule), so the fullest rank holds about
1/W of it. `reserve_dense` raises a topology's ``reserved_fraction`` to at least these bytes
(the fraction's share still covers activations when it is the larger).

Data-parallel tables are priced in cost/storage.py; this file covers the dense layers only.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from embshard.topology import GIB, Topology

PARAM_BYTES = 4  # fp32 weights, gradients and optimizer state
STATE_FLOATS = {"sgd": 0, "adagrad": 1, "adam": 2}  # per parameter (sgd with momentum: 1)


def state_floats(optimizer: str, momentum: float = 0.0) -> int:
    """Optimizer state floats per dense parameter."""
    if optimizer not in STATE_FLOATS:
        raise ValueError(f"dense optimizer {optimizer!r}: must be one of {sorted(STATE_FLOATS)}")
    return 1 if optimizer == "sgd" and momentum else STATE_FLOATS[optimizer]


def zero_shares(param_numels: Sequence[int], world_size: int) -> list[int]:
    """Parameters (elements) each rank updates under ZeroRedundancyOptimizer: largest first, each to the
    rank with the fewest so far (the lowest such rank on a tie)."""
    shares = [0] * world_size
    for n in sorted(param_numels, reverse=True):
        shares[shares.index(min(shares))] += n
    return shares


def dense_bytes_per_rank(param_numels: Sequence[int], floats_per_param: int, world_size: int,
                         sharded_update: bool) -> int:
    """Bytes of the dense layers on the fullest rank: weights, gradients and optimizer state."""
    total = sum(param_numels)
    state = max(zero_shares(param_numels, world_size)) if sharded_update else total
    return PARAM_BYTES * (2 * total + floats_per_param * state)


def reserve_dense(topology: Topology, dense_bytes: int) -> Topology:
    """``topology`` with at least ``dense_bytes`` of every rank's memory reserved; ValueError if they fill it."""
    if dense_bytes <= topology.reserved_bytes:
        return topology
    fraction = (dense_bytes + 1) / topology.rank_memory_bytes
    if fraction >= 1:
        raise ValueError(f"the dense layers need {dense_bytes / GIB:.3g} GiB per rank (weights, gradients, optimizer "
                         f"state), more than topology.hbm_gib={topology.hbm_gib:g}; shard their update "
                         "(optim.sharded_update=true), use smaller MLPs or ranks with more memory")
    return replace(topology, reserved_fraction=fraction)
