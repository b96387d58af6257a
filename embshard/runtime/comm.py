"""Collectives of the runtime: all-to-all with split sizes, the all-reduce of data-parallel
gradients, and the per-step header: every rank's batch size, agreed with the fewest messages, and a failure flag
that makes every rank raise when one rank rejects its input.

All tensors are split along dim 0; split sizes count rows. Works on gloo (CPU) and nccl
(GPU: tensors must live on the rank's device).

`counting_traffic` counts the bytes this rank sends and receives in every all-to-all,
all-reduce, reduce-scatter and all-gather issued through here (not the header), intra- and inter-host: what
`embshard.planner.cost.traffic` predicts. Off, it costs one check per collective.

Where ranks span hosts, `use_hosts` (called by every collection, on every rank) makes the
sub-groups of ``pg`` for collectives that run inside each host first, once per group and
ranks per host: this rank's host (in-host reduction of row-wise partial sums, host_reduce.py)
and the ranks of its local index on every host; `hierarchical_all_reduce` uses both.

Where a group's ranks share a host (gloo), `use_shared_memory` (called by every collection too) moves its
all-to-alls, all-reduces, reduce-scatters and all-gathers through shared memory (`embshard.runtime.shared_group`)
instead of gloo's loopback TCP: the same results, the same bytes counted. ``EMBSHARD_SHARED_MEMORY=0`` keeps gloo.
"""

from __future__ import annotations

import datetime
import math
import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from embshard.planner.cost.traffic import TrafficBytes, ring_allreduce_sent
from embshard.runtime.shared_group import SharedGroup, group_timeout_s
from embshard.specs import piece_rows
from embshard.topology import Topology


class TrafficCounter:
    """Bytes this rank sent and received, per link class, since it was made (or `reset`).

    Ranks are those of ``pg`` (the plan's ranks); rank r is on host r // local_world_size.
    Collectives on sub-groups of ``pg`` count by their members' ranks in ``pg``."""

    def __init__(self, pg: dist.ProcessGroup, local_world_size: int) -> None:
        self.local_world_size = local_world_size
        self.rank_in_pg = {g: r for r, g in enumerate(dist.get_process_group_ranks(pg))}
        self.host = self.rank_in_pg[dist.get_rank()] // local_world_size
        self._groups: dict[int, list[bool]] = {}
        self.reset()

    def reset(self) -> None:
        self.bytes = TrafficBytes()

    def _same_host(self, group: dist.ProcessGroup) -> list[bool]:
        """For each rank of ``group``: is it on this rank's host."""
        key = id(group)
        if key not in self._groups:
            self._groups[key] = [self.rank_in_pg[g] // self.local_world_size == self.host
                                 for g in dist.get_process_group_ranks(group)]
        return self._groups[key]

    def add(self, sent_to: Sequence[int], received_from: Sequence[int], group: dist.ProcessGroup) -> None:
        """Bytes sent to / received from each rank of ``group`` (this rank's own entries are skipped)."""
        me, same = dist.get_rank(group), self._same_host(group)
        intra_s = sum(n for r, n in enumerate(sent_to) if same[r] and r != me)
        intra_r = sum(n for r, n in enumerate(received_from) if same[r] and r != me)
        self.bytes = self.bytes + TrafficBytes(intra_s, intra_r, sum(sent_to) - intra_s - sent_to[me],
                                               sum(received_from) - intra_r - received_from[me])


_counters: list[TrafficCounter] = []


@contextmanager
def counting_traffic(pg: dist.ProcessGroup, local_world_size: int) -> Iterator[TrafficCounter]:
    """Count this rank's collective bytes while the block runs (``counter.bytes``)."""
    counter = TrafficCounter(pg, local_world_size)
    _counters.append(counter)
    try:
        yield counter
    finally:
        _counters.remove(counter)


_shared: "weakref.WeakKeyDictionary[dist.ProcessGroup, SharedGroup | None]" = weakref.WeakKeyDictionary()


def use_shared_memory(pg: dist.ProcessGroup, same_host: bool) -> SharedGroup | None:
    """Collective over ``pg`` (every rank at the same point: a collection's constructor): from now on its
    collectives run through shared memory where ``same_host`` (the plan's topology says so; `SharedGroup.create`
    checks it), the backend is gloo and ``EMBSHARD_SHARED_MEMORY`` is not 0. Made once per group; None where not."""
    if _shared.get(pg) is None and same_host and dist.get_world_size(pg) > 1 and dist.get_backend(pg) == "gloo" \
            and os.environ.get("EMBSHARD_SHARED_MEMORY", "1") != "0":
        _shared[pg] = SharedGroup.create(pg, same_host=True)
    return _shared.get(pg)


def shared_memory(pg: dist.ProcessGroup) -> SharedGroup | None:
    """What `use_shared_memory` made for ``pg``, if anything: its collectives' transport."""
    return _shared.get(pg)


def _summing(x: Tensor, pg: dist.ProcessGroup) -> SharedGroup | None:
    """The shared memory that sums ``x`` over ``pg`` (floating and contiguous), if any."""
    shared = _shared.get(pg)
    return shared if shared is not None and x.is_floating_point() and x.is_contiguous() else None


def all_to_all(x: Tensor, out_splits: Sequence[int], in_splits: Sequence[int], pg: dist.ProcessGroup) -> Tensor:
    """Send rows ``x[sum(in_splits[:r]) : +in_splits[r]]`` to rank r; receive ``out_splits[r]`` rows from rank r."""
    shared = _shared.get(pg)
    if shared is not None:
        out = shared.all_to_all(x, out_splits, in_splits)
    else:
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=pg)
    if _counters:
        row_bytes = x.element_size() * math.prod(x.shape[1:])
        for counter in _counters:
            counter.add([n * row_bytes for n in in_splits], [n * row_bytes for n in out_splits], pg)
    return out


def all_reduce(x: Tensor, pg: dist.ProcessGroup) -> None:
    """Sum contiguous ``x`` over the ranks in place; counted as a ring in rank order (`ring_allreduce_sent`)."""
    shared = _summing(x, pg)
    if shared is not None:
        shared.sum_(x.view(-1))
    else:
        dist.all_reduce(x, group=pg)
    _count_all_reduce(x, pg)


def all_reduce_pieces(x: Tensor, cuts: Sequence[int], pg: dist.ProcessGroup) -> list[Callable[[], object]]:
    """Sum 1-D ``x`` over the ranks in place, in the pieces between ``cuts`` (element offsets, 0 < c < numel),
    all in flight at once: one wait per piece, in order (call it before reading its piece). Through shared memory,
    the whole sum at once (the waits have nothing left to wait for). Counted as the one all-reduce of ``x`` it
    stands for (the cost model prices that one)."""
    if _summing(x, pg) is not None:
        all_reduce(x, pg)
        return [lambda: None] * (len(cuts) + 1)
    bounds = [0, *cuts, x.numel()]
    works = [dist.all_reduce(x[a:b], group=pg, async_op=True) for a, b in zip(bounds, bounds[1:])]
    _count_all_reduce(x, pg)
    return [work.wait for work in works]


def _count_all_reduce(x: Tensor, pg: dist.ProcessGroup) -> None:
    if _counters:
        W, me = dist.get_world_size(pg), dist.get_rank(pg)
        sent = [n * x.element_size() for n in ring_allreduce_sent(x.numel(), W)]
        to, frm = [0] * W, [0] * W
        to[(me + 1) % W] += sent[me]
        frm[(me - 1) % W] += sent[(me - 1) % W]
        for counter in _counters:
            counter.add(to, frm, pg)


@dataclass(frozen=True)
class HostGroups:
    topology: Topology  # the plan last built on the group: it decides (and prices) what runs in the host first
    local: dist.ProcessGroup  # the ranks of this rank's host
    across: dist.ProcessGroup  # the ranks of this rank's local index, one per host


_subgroups: "weakref.WeakKeyDictionary[dist.ProcessGroup, dict]" = weakref.WeakKeyDictionary()  # pg -> L -> (local, across)
_host_groups: "weakref.WeakKeyDictionary[dist.ProcessGroup, HostGroups]" = weakref.WeakKeyDictionary()  # in use


def use_hosts(pg: dist.ProcessGroup, topology: Topology) -> HostGroups | None:
    """The host sub-groups of ``pg`` for ``topology`` (made once per group and ranks per host, on every
    rank at the same point: a collection's constructor), or None where nothing runs in the host first
    (one host, one rank per host, or ``topology.reduce_in_host`` off)."""
    L = topology.local_world_size
    if not topology.reduces_in_host or L == 1:
        _host_groups.pop(pg, None)
        return None
    made = _subgroups.setdefault(pg, {})
    if L not in made:
        ranks, me = dist.get_process_group_ranks(pg), dist.get_rank(pg)
        host, index = divmod(me, L)
        # made in the same order on every rank: names of locally synchronised groups count the groups a rank has
        made[L] = (new_subgroup(pg, ranks[host * L:(host + 1) * L], use_local_synchronization=True),
                   new_subgroup(pg, ranks[index::L], use_local_synchronization=True))
    _host_groups[pg] = HostGroups(topology, *made[L])
    return _host_groups[pg]


def new_subgroup(pg: dist.ProcessGroup, ranks: Sequence[int], **kwargs) -> dist.ProcessGroup:
    """`dist.new_group` of ``ranks`` (of ``pg``) that fails a collective after ``pg``'s timeout where gloo's says it
    (torch's default for a new group is 30 min, whatever ``pg``'s)."""
    timeout_s = group_timeout_s(pg)
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    return dist.new_group(list(ranks), timeout=timeout, **kwargs)


def host_groups(pg: dist.ProcessGroup) -> HostGroups | None:
    """What `use_hosts` made for ``pg`` last, if anything."""
    return _host_groups.get(pg)


def hierarchical_all_reduce(x: Tensor, hosts: HostGroups) -> None:
    """Sum contiguous ``x`` over all ranks in place: each of the host's L ranks owns 1/L of it
    (`embshard.specs.piece_rows`): an all-to-all inside the host and a sum (reduce-scatter), an all-reduce of
    this rank's share across hosts, an all-to-all inside the host (all-gather). Counted as such."""
    L, i = dist.get_world_size(hosts.local), dist.get_rank(hosts.local)
    chunks = piece_rows(x.numel(), L)
    flat = x.view(-1)
    share = all_to_all(flat, [chunks[i]] * L, chunks, hosts.local).view(L, chunks[i]).sum(0)
    all_reduce(share, hosts.across)
    flat.copy_(all_to_all(share.repeat(L), chunks, [chunks[i]] * L, hosts.local))


def reduce_scatter(x: Tensor, pg: dist.ProcessGroup) -> Tensor:
    """Sum ``x`` [W * C] over the ranks and keep this rank's chunk [C]; counted as a ring (W - 1 chunks to the next rank)."""
    W, shared = dist.get_world_size(pg), _shared.get(pg)
    if shared is not None:
        out = shared.reduce_scatter(x)
    else:
        out = x.new_empty(x.numel() // W)
        dist.reduce_scatter_tensor(out, x, group=pg)
    _count_ring(out, pg)
    return out


def all_gather(out: Tensor, x: Tensor, pg: dist.ProcessGroup) -> Tensor:
    """Every rank's ``x`` [C] into ``out`` [W * C], in rank order; counted as a ring (W - 1 chunks to the next rank)."""
    shared = _shared.get(pg)
    if shared is not None:
        shared.all_gather(out, x)
    else:
        dist.all_gather_into_tensor(out, x, group=pg)
    _count_ring(x, pg)
    return out


def _count_ring(chunk: Tensor, pg: dist.ProcessGroup) -> None:
    if _counters:
        W, me = dist.get_world_size(pg), dist.get_rank(pg)
        to, frm = [0] * W, [0] * W
        to[(me + 1) % W] += (W - 1) * chunk.numel() * chunk.element_size()
        frm[(me - 1) % W] += (W - 1) * chunk.numel() * chunk.element_size()
        for counter in _counters:
            counter.add(to, frm, pg)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, out_splits: list[int], in_splits: list[int], pg: dist.ProcessGroup, grad_scale: float) -> Tensor:
        ctx.splits, ctx.pg, ctx.grad_scale = (out_splits, in_splits), pg, grad_scale
        return all_to_all(x, out_splits, in_splits, pg)

    @staticmethod
    def backward(ctx, grad: Tensor):
        out_splits, in_splits = ctx.splits
        back = all_to_all(grad, in_splits, out_splits, ctx.pg)
        if ctx.grad_scale != 1.0:
            back.mul_(ctx.grad_scale)
        return back, None, None, None, None


def all_to_all_autograd(
    x: Tensor, out_splits: Sequence[int], in_splits: Sequence[int], pg: dist.ProcessGroup, grad_scale: float = 1.0
) -> Tensor:
    """`all_to_all` whose backward sends gradients back the same way, multiplied by ``grad_scale``."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), pg, grad_scale)


class _LocalPart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, splits: list[int], pg: dist.ProcessGroup, grad_dtype: torch.dtype) -> Tensor:
        ctx.splits, ctx.pg, ctx.grad_dtype = splits, pg, grad_dtype
        rank = dist.get_rank(pg)
        start = sum(splits[:rank])
        return x[start:start + splits[rank]]

    @staticmethod
    def backward(ctx, grad: Tensor):
        world = dist.get_world_size(ctx.pg)
        mine = ctx.splits[dist.get_rank(ctx.pg)]
        sent = grad.to(ctx.grad_dtype).contiguous().repeat(world, *([1] * (grad.dim() - 1)))
        full = all_to_all(sent, ctx.splits, [mine] * world, ctx.pg).to(grad.dtype)
        return full.div_(world), None, None, None


def local_part(x: Tensor, splits: Sequence[int], pg: dist.ProcessGroup, grad_dtype: torch.dtype = torch.float32) -> Tensor:
    """This rank's rows of ``x``, which every rank computed in full (rows grouped by rank, ``splits``).

    Backward gathers every rank's gradient of its part (sent as ``grad_dtype``: the plan's
    backward wire dtype) and divides by the world size, so every replica receives the same
    gradient: the rank average, as DDP gives dense parameters.
    """
    return _LocalPart.apply(x, list(splits), pg, grad_dtype)


FAILED = 1 << 62  # the value a rank that rejected its input puts in a batch-size header (above any batch size)

# Per process group: did the last batch sizes agreed on it differ between ranks (the next header then all-gathers
# them at once). Every rank reads and writes it in the same order: headers on one group are started and read in
# the same order on every rank, as all of its collectives are.
_sizes_differed: "weakref.WeakKeyDictionary[dist.ProcessGroup, bool]" = weakref.WeakKeyDictionary()


class Header:
    """Whether any rank of ``pg`` rejected its input and, unless ``value`` is None, every rank's value (a batch
    size), agreed in flight (`start_header`); `result` waits for it, once.

    By the cheapest gloo collectives that say it. On a few bytes gloo's cost is not the bytes: an all-reduce of 1
    or 2 elements costs a fraction of one of 3 or more, or of an all-gather (measured, 4 ranks sharing 2 cores, wall /
    CPU per call: all-gather of 2 int64 3.7-4.0 / 1.4-1.5 ms; all-reduce of 1 int64 0.9-1.2 / 0.2 ms, of 2 1.0-1.35 /
    0.23-0.34 ms, of 3 to 65,536 elements 2.7-6 / 1-2.2 ms; 2 ranks: all-gather 0.73-0.86 ms, all-reduce of 1 or 2
    0.30-0.58 ms). So: ``value`` None, a MAX all-reduce of the failure flag; else a MAX all-reduce of (value, or
    FAILED, and -value), which gives every rank's value where all are equal (a batch of fixed size per rank, the
    common case) and is followed by an all-gather of the values where they differ; where they differed the last
    time on ``pg`` (serving's batches of requests), the all-gather of (flag, value) right away."""

    def __init__(self, value: int | None, error: str | None, pg: dist.ProcessGroup, device: torch.device) -> None:
        assert value is None or 0 <= value < FAILED, value
        self.value, self.error, self.pg, self.world = value, error, pg, dist.get_world_size(pg)
        self.gather = value is not None and _sizes_differed.get(pg, False)
        failed = error is not None
        if self.gather:
            self.buffer, self.work = _start_gather([value], error, pg, device)
        else:
            flags = [int(failed)] if value is None else [FAILED, 0] if failed else [value, -value]
            self.buffer = torch.tensor(flags, dtype=torch.int64, device=device)
            self.work = dist.all_reduce(self.buffer, op=dist.ReduceOp.MAX, group=pg, async_op=True)
        self._done, self._values = False, None

    def result(self) -> tuple[int, ...] | None:
        """Every rank's value in rank order (None where ``value`` was None); ValueError on every rank if any
        rank passed an error."""
        if not self._done:
            self.work.wait()
            self._values, self._done = self._agreed(), True
        return self._values

    def _agreed(self) -> tuple[int, ...] | None:
        if self.gather:
            values = tuple(_gathered(self.buffer, 1, self.error, self.pg)[:, 0].tolist())
        else:
            agreed = self.buffer.tolist()
            if agreed[0] >= (1 if self.value is None else FAILED):
                _raise_on_every_rank(self.error, self.pg)
            if self.value is None:
                return None
            if agreed[0] == -agreed[1]:  # max == min: every rank's value
                values = (agreed[0],) * self.world
            else:
                values = tuple(gather_header([self.value], None, self.pg, self.buffer.device)[:, 0].tolist())
        _sizes_differed[self.pg] = len(set(values)) > 1
        return values


def _raise_on_every_rank(error: str | None, pg: dist.ProcessGroup) -> None:
    """Every rank calls it once the ranks agreed that one failed: the ValueError naming each failed rank's error."""
    messages: list[str | None] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(messages, error, group=pg)
    raise ValueError("; ".join(f"rank {r}: {m}" for r, m in enumerate(messages) if m is not None))


def start_header(value: int | None, error: str | None, pg: dist.ProcessGroup, device: torch.device) -> Header:
    """Start agreeing on every rank's ``value`` (a batch size; None: on failure alone) and a failure flag;
    `Header.result` waits for it and raises ValueError on every rank if any rank passed an error.

    Each rank validates its own input before calling this (the first collective of a step), so a bad batch
    never leaves a rank inside a collective its peers skipped: a rank that passes an error waits for the
    result at once (and raises); the others may first do work that issues no collective (local look-ups).
    """
    return Header(value, error, pg, device)


def gather_header(values: Sequence[int], error: str | None, pg: dist.ProcessGroup, device: torch.device) -> Tensor:
    """Every rank's ``values`` (a few ints: [world_size, len(values)] int64) and a failure flag, all-gathered at
    once: ValueError on every rank if any rank passed an error. Per step, `start_header` costs fewer messages."""
    gathered, work = _start_gather(values, error, pg, device)
    work.wait()
    return _gathered(gathered, len(values), error, pg)


def _start_gather(values: Sequence[int], error: str | None, pg: dist.ProcessGroup,
                  device: torch.device) -> tuple[Tensor, dist.Work]:
    """Start the all-gather of (failure flag, *values) from every rank: (its buffer, its work)."""
    local = torch.tensor([int(error is not None), *values], dtype=torch.int64, device=device)
    gathered = local.new_empty(dist.get_world_size(pg) * local.numel())
    return gathered, dist.all_gather_into_tensor(gathered, local, group=pg, async_op=True)


def _gathered(gathered: Tensor, num_values: int, error: str | None, pg: dist.ProcessGroup) -> Tensor:
    """The landed all-gather of `_start_gather`: every rank's values [world_size, num_values], or ValueError on
    every rank if any rank passed an error."""
    rows = gathered.view(-1, 1 + num_values)
    if bool(rows[:, 0].any()):
        _raise_on_every_rank(error, pg)
    return rows[:, 1:]
