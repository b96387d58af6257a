"""In-host reduction of pooled row-wise partial sums, before output dist.

A *group* is the row shards of one feature (and column block) on one host. When a group
has two or more members, they all-to-all their partial sums inside the host's sub-group
so that, for every sample owner w, one member (`embshard.planner.cost.traffic.reducers`)
holds the host's sum of w's rows; only that member sends them to w, so each owner gets
one copy per host instead of one per row shard. Backward mirrors it through autograd:
gradients reach each host's reducer once and fan out to the members inside the host.
Single-member groups and all other slots are sent directly, as before.

`HostReduction` is static per collection: the groups, the sub-group of this rank's host
(made once per process group, `embshard.runtime.comm.use_hosts`) and the layout of every
message; index tensors are cached per batch sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.planner.cost.traffic import reducers
from embshard.runtime.comm import all_to_all_autograd, host_groups
from embshard.runtime.permute import Permute, inverse_permutation, run_unit
from embshard.runtime.routing import Routing, Slot


@dataclass(frozen=True)
class Group:
    host: int
    members: tuple[int, ...]  # sorted ranks
    slot_index: tuple[int, ...]  # each member's index of the group's slot in its slots_by_rank
    num_cols: int
    reducer: tuple[int, ...]  # for every sample owner, the member that sends it the host's sum


def reduced_groups(routing: Routing, local_world_size: int) -> tuple[Group, ...]:
    """Groups with two or more members, in the same order on every rank."""
    found: dict[tuple[int, int, int, int], list[tuple[int, int]]] = {}
    for r, slots in enumerate(routing.slots_by_rank):
        for i, s in enumerate(slots):
            found.setdefault((r // local_world_size, s.feature, s.col_offset, s.num_cols), []).append((r, i))
    return tuple(Group(key[0], tuple(r for r, _ in m), tuple(i for _, i in m), key[3],
                       tuple(reducers([r for r, _ in m], routing.world_size).tolist()))
                 for key, m in found.items() if len(m) > 1)


class HostReduction:
    def __init__(self, routing: Routing, groups: tuple[Group, ...], local_world_size: int, pg: dist.ProcessGroup,
                 device: torch.device) -> None:
        self.routing, self.groups, self.device = routing, groups, device
        me, W, L = routing.rank, routing.world_size, local_world_size
        self.host, self.L = me // L, L
        reduced = {(r, i) for g in groups for r, i in zip(g.members, g.slot_index)}
        self.reduced = reduced
        mine = routing.slots_by_rank[me]
        self.col_start = [sum(s.num_cols for s in mine[:i]) for i in range(len(mine))]
        self.my_width = sum(s.num_cols for s in mine)
        self.direct_cols = [c for i, s in enumerate(mine) if (me, i) not in reduced
                            for c in range(self.col_start[i], self.col_start[i] + s.num_cols)]
        # every block moved is whole runs of `unit` floats (slot widths, so their offsets and my_width, are multiples of
        # it): one index a run
        self.unit = run_unit(*(s.num_cols for s in mine))
        self.my_groups = [g for g in groups if me in g.members]
        self.assigned = [[g for g in self.my_groups if g.reducer[w] == me] for w in range(W)]
        self.width_to = [len(self.direct_cols) + sum(g.num_cols for g in self.assigned[w]) for w in range(W)]
        hosts = host_groups(pg)
        assert hosts is not None and hosts.topology.local_world_size == L, "the collection makes the host sub-groups first (comm.use_hosts)"
        self.sub_pg = hosts.local if any(g.host == self.host for g in groups) else None
        self._cache: dict[tuple[int, ...], tuple] = {}

    def blocks_from(self, source: int) -> list[Slot]:
        """The slots whose columns ``source`` sends to this rank, in message order."""
        slots = self.routing.slots_by_rank[source]
        direct = [s for i, s in enumerate(slots) if (source, i) not in self.reduced]
        return direct + [slots[g.slot_index[g.members.index(source)]] for g in self.groups
                         if source in g.members and g.reducer[self.routing.rank] == source]

    def _my_slot_cols(self, g: Group) -> int:
        return self.col_start[g.slot_index[g.members.index(self.routing.rank)]]

    def _indices(self, batch_sizes: tuple[int, ...]):
        """For these batch sizes: (X's permutation into [stage-1 message, direct floats] and its inverse,
        stage-1 send splits, receive splits, Y index of every received run, Y size, the permutation of
        [direct floats, Y] into the stage-2 message and its inverse, its splits). Every float of X is sent
        exactly once, in stage 1 (grouped slots, to their reducer) or stage 2 (direct slots); every float
        of Y once, in stage 2: gathers by permutations, whose backward needs no zero-filled scatter. The
        indexes count runs of `unit` floats (splits and sizes count floats)."""
        if batch_sizes in self._cache:
            return self._cache[batch_sizes]
        me, W, dev, u = self.routing.rank, self.routing.world_size, self.device, self.unit
        row0 = [sum(batch_sizes[:w]) for w in range(W)]
        rows = [torch.arange(row0[w], row0[w] + batch_sizes[w], device=dev) for w in range(W)]
        peers = range(self.host * self.L, (self.host + 1) * self.L)
        # Y: for w, for each group this rank reduces for w: [B_w, d]
        y_off, size = {}, 0
        for w in range(W):
            for g in self.assigned[w]:
                y_off[(w, id(g))] = size
                size += batch_sizes[w] * g.num_cols
        send1, in1, out1, y_index = [], [], [], []
        for p in peers:
            n = 0
            for g in self.my_groups:
                cols = torch.arange(g.num_cols // u, device=dev) + self._my_slot_cols(g) // u
                for w in range(W):
                    if g.reducer[w] == p:
                        send1.append((rows[w].unsqueeze(1) * (self.my_width // u) + cols).reshape(-1))
                        n += batch_sizes[w] * g.num_cols
            in1.append(n)
            n = 0
            for g in self.my_groups:
                if p in g.members:
                    for w in range(W):
                        if g in self.assigned[w]:
                            m = batch_sizes[w] * g.num_cols
                            y_index.append(torch.arange(y_off[(w, id(g))] // u, (y_off[(w, id(g))] + m) // u, device=dev))
                            n += m
            out1.append(n)
        x_runs = sum(batch_sizes) * self.my_width // u
        direct = torch.tensor(self.direct_cols[::u], dtype=torch.int64, device=dev) // u  # the first column of each run
        nd = len(self.direct_cols) // u
        direct_x = (torch.arange(sum(batch_sizes), device=dev).unsqueeze(1) * (self.my_width // u) + direct).reshape(-1)
        send2 = []  # into [direct runs (rows in order, direct columns), Y]
        for w in range(W):
            parts = [row0[w] * nd + torch.arange(batch_sizes[w] * nd, device=dev).view(batch_sizes[w], nd)]
            for g in self.assigned[w]:
                local = torch.arange(batch_sizes[w], device=dev).unsqueeze(1) * (g.num_cols // u) + torch.arange(g.num_cols // u, device=dev)
                parts.append(local + direct_x.numel() + y_off[(w, id(g))] // u)
            send2.append(torch.cat(parts, dim=1).reshape(-1))
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        cat = lambda xs: torch.cat(xs) if xs else empty  # noqa: E731
        perm_x, perm_z = torch.cat([cat(send1), direct_x]), cat(send2)
        assert perm_x.numel() == x_runs and perm_z.numel() == direct_x.numel() + size // u, "every float is sent exactly once"
        out = (perm_x, inverse_permutation(perm_x), in1, out1, cat(y_index), size, perm_z, inverse_permutation(perm_z),
               [b * w for b, w in zip(batch_sizes, self.width_to)])
        self._cache[batch_sizes] = out
        return out

    def __call__(self, local: Tensor, batch_sizes: tuple[int, ...]) -> tuple[Tensor, list[int]]:
        """Reduce this host's partial sums; returns (flat stage-2 message for every sample owner, its splits)."""
        perm_x, inverse_x, in1, out1, y_index, y_size, perm_z, inverse_z, splits = self._indices(batch_sizes)
        u = self.unit
        x = local.reshape(-1, u)
        permuted = Permute.apply(x, perm_x, inverse_x).reshape(-1)
        sent, direct = permuted.split([sum(in1), permuted.numel() - sum(in1)])  # split: no zeros in backward
        y = x.new_zeros(y_size // u, u)
        if self.sub_pg is not None:
            y = y.index_add(0, y_index, all_to_all_autograd(sent, out1, in1, self.sub_pg).view(-1, u))
        return Permute.apply(torch.cat([direct, y.reshape(-1)]).view(-1, u), perm_z, inverse_z).reshape(-1), splits
