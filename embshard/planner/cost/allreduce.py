"""The all-reduce of data-parallel gradients: one ring over all ranks, or hierarchical where
ranks span hosts. Hierarchical: each of a host's L ranks owns 1/L of the buffer
(`embshard.specs.piece_rows`); a reduce-scatter inside the host (an all-to-all, then a sum), a ring
all-reduce of that share across hosts among the ranks of the same local index, an
all-gather inside the host (embshard.runtime.comm.hierarchical_all_reduce). Only 1/L of the
buffer leaves each rank across hosts, against 2(W-1)/W of it through one rank per host in
the ring. Time per link class of both, and which one the runtime runs
(`hierarchical_allreduce`: the faster by this model, the hierarchy's calibrated CPU work
``dp_hier_*`` included; the runtime and the traffic model both ask it). No torch here.
"""

from __future__ import annotations

from embshard.planner.cost.units import bytes_ms, work_ms
from embshard.topology import Topology


def _exchange_ms(sent_ms: float, received_ms: float, topo: Topology) -> float:
    return max(sent_ms, received_ms) if topo.full_duplex else sent_ms + received_ms


def collective_fixed_ms(topo: Topology, steps_per_peer: int = 1) -> float:
    """Calibrated fixed cost of one collective over all ranks: collective_ms per step and peer rank,
    and inter_host_collective_ms more per step and peer rank on another host."""
    W, L = topo.world_size, topo.local_world_size
    return (topo.collective_ms * (W - 1) + topo.inter_host_collective_ms * (W - L)) * steps_per_peer


def _flat_legs_ms(num_bytes: float, topo: Topology) -> tuple[float, float, bool, bool]:
    """(sent ms, received ms, is the send on an inter-host link, is the receive) of the ring's slowest rank."""
    W, L = topo.world_size, topo.local_world_size
    per_rank = 2 * num_bytes * (W - 1) / W
    sent_across, received_across = topo.num_hosts > 1, L == 1 and W > 1
    sent = bytes_ms(per_rank, topo.inter_host_gb_per_s if sent_across else topo.intra_host_gb_per_s)
    received = bytes_ms(per_rank, topo.inter_host_gb_per_s if received_across else topo.intra_host_gb_per_s)
    return sent, received, sent_across, received_across


def flat_allreduce_ms(num_bytes: float, topo: Topology) -> float:
    """A ring over the W ranks in rank order, bandwidth only: each sends 2(W-1)/W of the buffer to
    its successor; the last rank of a host sends it across hosts (and receives it inside the host)."""
    sent, received, _, _ = _flat_legs_ms(num_bytes, topo)
    return _exchange_ms(sent, received, topo)


def flat_allreduce_link_ms(num_bytes: float, topo: Topology) -> float:
    """Of `flat_allreduce_ms`, the time on inter-host links: what its legs across hosts add to its legs inside one."""
    sent, received, sent_across, received_across = _flat_legs_ms(num_bytes, topo)
    in_host = _exchange_ms(0.0 if sent_across else sent, 0.0 if received_across else received, topo)
    return _exchange_ms(sent, received, topo) - in_host


def hierarchical_allreduce_ms(num_bytes: float, topo: Topology) -> float:
    """Bandwidth only: reduce-scatter and all-gather inside the host ((L-1)/L of the buffer each way,
    each), a ring across the H hosts of this rank's 1/L share (2(H-1)/H of it each way). On one
    host, the ring's time."""
    L = topo.local_world_size
    in_host = bytes_ms(num_bytes * (L - 1) / L, topo.intra_host_gb_per_s)
    return 2 * _exchange_ms(in_host, in_host, topo) + hierarchical_allreduce_link_ms(num_bytes, topo)


def hierarchical_allreduce_link_ms(num_bytes: float, topo: Topology) -> float:
    """Of `hierarchical_allreduce_ms`, the time on inter-host links: the ring across the hosts."""
    across = bytes_ms(2 * num_bytes * (topo.num_hosts - 1) / topo.num_hosts / topo.local_world_size, topo.inter_host_gb_per_s)
    return _exchange_ms(across, across, topo)


def _hierarchical_extra_ms(num_bytes: float, topo: Topology) -> float:
    """What the hierarchy costs beyond moving bytes: fixed costs of two all-to-alls among the L ranks of a
    host and of a ring (2 steps per peer) among H ranks on other hosts; its own copies (summing the
    received parts, the all-gather's input and result: 3 x the buffer) at the calibrated per-byte copy
    cost (dist_ns_per_byte), which gloo's ring does inside its one call; and the CPU work measured beyond
    all that (calibrated, 0 in the datasheet model: ``dp_hier_ns_per_byte`` of the buffer, ``dp_hier_call_ms``
    per call; fitted on layouts run hierarchically and flat, embshard.calibrate.fit.dp_hier_fit)."""
    L, H = topo.local_world_size, topo.num_hosts
    fixed = 2 * topo.collective_ms * (L - 1) + 2 * (topo.collective_ms + topo.inter_host_collective_ms) * (H - 1)
    return fixed + work_ms(num_bytes, 3 * topo.dist_ns_per_byte + topo.dp_hier_ns_per_byte) + topo.dp_hier_call_ms


def hierarchical_total_ms(num_bytes: float, topo: Topology) -> float:
    """The hierarchy's time with its fixed costs, copies and calibrated CPU work."""
    return hierarchical_allreduce_ms(num_bytes, topo) + _hierarchical_extra_ms(num_bytes, topo)


def flat_total_ms(num_bytes: float, topo: Topology) -> float:
    """The ring's time with its fixed costs (two steps per peer)."""
    return flat_allreduce_ms(num_bytes, topo) + collective_fixed_ms(topo, 2)


def hierarchical_allreduce(num_bytes: float, topo: Topology) -> bool:
    """Does the runtime all-reduce num_bytes hierarchically: ranks on two or more hosts, two or more
    per host, ``topology.reduce_in_host`` on, and predicted faster than the ring (fixed costs, copies and the
    hierarchy's calibrated CPU work included)."""
    if not topo.reduces_in_host or topo.local_world_size == 1:
        return False
    return hierarchical_total_ms(num_bytes, topo) < flat_total_ms(num_bytes, topo)


def runtime_allreduce_ms(num_bytes: float, topo: Topology) -> float:
    """Time of the all-reduce the runtime runs for num_bytes, fixed costs (and the hierarchy's copies) included."""
    return (hierarchical_total_ms if hierarchical_allreduce(num_bytes, topo) else flat_total_ms)(num_bytes, topo)


def runtime_allreduce_parts_ms(num_bytes: float, topo: Topology) -> tuple[float, float]:
    """(`runtime_allreduce_ms`, of it the time on inter-host links: 0 on one host), the runtime's choice made once.
    Link time is apart because the cost model's per-phase factors (a rank's work, fitted on one host) do not scale it."""
    if hierarchical_allreduce(num_bytes, topo):
        return hierarchical_total_ms(num_bytes, topo), hierarchical_allreduce_link_ms(num_bytes, topo)
    return flat_total_ms(num_bytes, topo), flat_allreduce_link_ms(num_bytes, topo)
