"""Collectives among the ranks of one host through shared memory: all-to-all, sum, reduce-scatter and all-gather.

gloo moves every byte between two processes of one host through TCP: on a 2-core Intel Xeon VM its all-reduce of
3 MB took 6 ms (half of the runtime benchmark's data_parallel small step) and its threads took CPU from the ranks'
own. Here every rank copies what it sends into its slot of one file in /dev/shm, mapped by all, writes the byte
offset of each destination's part and its size in its header line, then raises its flag; once every rank's flag is
up, each reads its parts from the others' slots (all-to-all) or adds the slots in rank order (sum: the same result on
every rank; on 2 ranks gloo's, a + b = b + a).

Rounds alternate between two halves of each slot (and of the sizes and offsets): a rank that writes round k + 2 into the half
of round k has seen every rank's flag of round k + 1 up, which a rank raises only once it has read round k. The flag
is a plain store after the data's: x86-64 makes stores visible in program order (elsewhere `create` returns None).
A rank whose message does not fit posts size -1: every rank sees it after the same wait, so all of them run that
call on gloo instead, then grow the file together to twice the largest size posted. A sum, the same size on every
rank, runs in rounds of the slot instead (the file grown to SUM_ROUND_BYTES first), however large. A rank that waits checks its
peers' processes every WATCH_S, so one that exited fails the others at once (as gloo fails when a peer's connection
drops); one alive but stuck fails them after the process group's timeout (`group_timeout_s`), as gloo would.

    group = SharedGroup.create(pg, same_host=True)          # collective; None where it cannot run (use gloo)
    out = group.all_to_all(x, out_splits, in_splits)          # as embshard.runtime.comm.all_to_all
    group.sum_(flat)                                          # flat 1-D floating: now the sum over the ranks
    mine = group.reduce_scatter(x)                            # this rank's chunk of the sum of x [W * C]
    group.all_gather(out, x)                                  # every rank's x [C] into out [W * C]
"""

from __future__ import annotations

import math
import os
import platform
import secrets
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor

SHM_DIR = Path("/dev/shm")
START_BYTES = 1 << 20  # each rank's slot half at first; grown on demand
MAX_BYTES = 1 << 30  # the file's largest size: beyond it every call runs on gloo
SUM_ROUND_BYTES = 4 << 20  # a sum runs in rounds of at most the slot, which it grows to this size where smaller
WAIT_S = 300.0  # where a group's timeout cannot be read (the launcher's default ``collective_timeout_s``)
WATCH_S = 0.5
SPIN_S = 2e-4  # a wait spins (yielding the core) this long, then naps NAP_S between looks
NAP_S = 5e-5
_FLAG, _PID, _MARK, _SIZE, _OFFSETS = 0, 1, 2, 3, 5  # header line: the sizes then the offsets (W + 1) of both halves


class SharedGroup:
    def __init__(self, pg: dist.ProcessGroup, path: Path, slot_bytes: int) -> None:
        self.pg, self.slot_bytes = pg, slot_bytes
        self.rank, self.world = dist.get_rank(pg), dist.get_world_size(pg)
        line = _line_int64(self.world)
        memory = torch.from_file(str(path), shared=True, size=_file_bytes(self.world, slot_bytes), dtype=torch.uint8)
        self.lines = memory[:self.world * line * 8].view(torch.int64).view(self.world, line)
        self.slots = memory[self.world * line * 8:].view(2, self.world, slot_bytes)
        self.round = 0
        self.wait_s = group_timeout_s(pg) or WAIT_S

    @staticmethod
    def create(pg: dist.ProcessGroup, same_host: bool, slot_bytes: int = START_BYTES) -> "SharedGroup | None":
        """Collective over ``pg``: a SharedGroup, or None on every rank where it cannot run: ranks not all on one host
        (``same_host``, from the plan's topology, and checked: every rank must see every other's mark in the file),
        no x86-64, or no room in /dev/shm."""
        world = dist.get_world_size(pg)
        usable = same_host and world > 1 and platform.machine() in ("x86_64", "AMD64")
        return _open(pg, slot_bytes, usable)

    def all_to_all(self, x: Tensor, out_splits: Sequence[int], in_splits: Sequence[int]) -> Tensor:
        """Rows ``x[sum(in_splits[:r]) : +in_splits[r]]`` to rank r; ``out_splits[r]`` rows from rank r."""
        x = x.contiguous()
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        row = x.element_size() * math.prod(x.shape[1:])
        offsets = [0]
        for n in in_splits:
            offsets.append(offsets[-1] + n * row)
        half = self._round(_bytes(x), offsets,
                           lambda: dist.all_to_all_single(out, x, list(out_splits), list(in_splits), group=self.pg))
        if half is None:
            return out
        received, at = _bytes(out), 0
        for r, n in enumerate(out_splits):
            start = int(self.lines[r, _OFFSETS + half * (self.world + 1) + self.rank])
            received[at:at + n * row].copy_(self.slots[half, r, start:start + n * row])
            at += n * row
        return out

    def sum_(self, flat: Tensor) -> None:
        """Every rank calls it with its buffer (1-D, contiguous, floating); on return ``flat`` holds the sum over the
        ranks, added in rank order in ``flat``'s dtype. In rounds of at most the slot (the buffer's size is the
        same on every rank, so they agree on the rounds without a word), each grown first to SUM_ROUND_BYTES or
        the buffer where smaller: any size runs here, in a file of bounded size."""
        assert flat.dim() == 1 and flat.is_contiguous() and flat.is_floating_point(), (flat.dtype, flat.shape)
        size = flat.numel() * flat.element_size()
        if 0 <= self.slot_bytes < min(size, SUM_ROUND_BYTES):
            self._resize(min(size, SUM_ROUND_BYTES))
        if self.slot_bytes < 0:
            dist.all_reduce(flat, group=self.pg)
            return
        step = self.slot_bytes // flat.element_size()
        for start in range(0, flat.numel(), step):
            part = flat[start:start + step]
            half, fits = self._post(_bytes(part), [0, part.numel() * part.element_size()])
            assert fits, "every rank's part fits the slot"
            self._add_slots(part, half, 0)

    def reduce_scatter(self, x: Tensor) -> Tensor:
        """``x`` [W * C] (floating) summed over the ranks; this rank's chunk [C] of the sum."""
        assert x.dim() == 1 and x.is_contiguous() and x.is_floating_point() and x.numel() % self.world == 0, x.shape
        out = x.new_empty(x.numel() // self.world)
        half = self._round(_bytes(x), [0, x.numel() * x.element_size()],
                           lambda: dist.reduce_scatter_tensor(out, x, group=self.pg))
        if half is not None:
            self._add_slots(out, half, self.rank * out.numel() * out.element_size())
        return out

    def all_gather(self, out: Tensor, x: Tensor) -> Tensor:
        """Every rank's ``x`` [C] into ``out`` [W * C], in rank order."""
        assert out.numel() == self.world * x.numel() and out.is_contiguous() and out.dtype == x.dtype, (out.shape, x.shape)
        x = x.contiguous()
        half = self._round(_bytes(x), [0, x.numel() * x.element_size()],
                           lambda: dist.all_gather_into_tensor(out, x, group=self.pg))
        if half is not None:
            n = x.numel() * x.element_size()
            _bytes(out).view(self.world, n).copy_(self.slots[half, :, :n])
        return out

    def _add_slots(self, out: Tensor, half: int, start: int) -> None:
        """``out`` = the sum, in rank order, of every rank's slot bytes [start, start + out's bytes) as out's dtype."""
        n = out.numel() * out.element_size()
        parts = [self.slots[half, r, start:start + n].view(out.dtype) for r in range(self.world)]
        torch.add(parts[0], parts[1], out=out)
        for part in parts[2:]:
            out.add_(part)

    def _round(self, data: Tensor, offsets: Sequence[int], on_gloo: Callable[[], object]) -> int | None:
        """One round of a call whose message may not fit: this round's half, or None where the call ran as ``on_gloo``
        instead, on every rank alike (the file grown past MAX_BYTES before, or some rank's bytes did not fit this
        round: then the file grows)."""
        if self.slot_bytes < 0:  # grown past MAX_BYTES: gloo from then on
            on_gloo()
            return None
        half, fits = self._post(data, offsets)
        if not fits:
            on_gloo()
            self._grow(half)
            return None
        return half

    def _post(self, data: Tensor, offsets: Sequence[int]) -> tuple[int, bool]:
        """Write this rank's bytes and offsets into this round's half, raise the flag, wait for every rank's: (the
        half, whether every rank's bytes fit: the same on every rank)."""
        half = self.round % 2
        self.round += 1
        fits = data.numel() <= self.slot_bytes
        if fits:
            self.slots[half, self.rank, :data.numel()].copy_(data)
            base = _OFFSETS + half * (self.world + 1)
            self.lines[self.rank, base:base + len(offsets)] = torch.tensor(offsets, dtype=torch.int64)
        self.lines[self.rank, _SIZE + half] = data.numel() if fits else -1 - data.numel()
        self.lines[self.rank, _FLAG] = self.round
        self._wait(self.round)
        return half, int(self.lines[:, _SIZE + half].min()) >= 0

    def _grow(self, half: int) -> None:
        """After a round of ``half`` where some rank's bytes did not fit (every rank saw the same sizes): a file of
        twice the largest, created together; on gloo from now on where that passes MAX_BYTES."""
        self._resize(2 * max(-1 - int(s) if s < 0 else int(s) for s in self.lines[:, _SIZE + half].tolist()))

    def _resize(self, slot_bytes: int) -> None:
        """Collective: a new file of ``slot_bytes`` slots in place of this one (on gloo from now on where it would pass
        MAX_BYTES or cannot be made)."""
        grown = _open(self.pg, slot_bytes, _file_bytes(self.world, slot_bytes) <= MAX_BYTES)
        self.slot_bytes = -1 if grown is None else grown.slot_bytes  # -1: nothing fits, every call on gloo
        if grown is not None:
            self.lines, self.slots, self.round = grown.lines, grown.slots, 0

    def _wait(self, round_: int) -> None:
        """Until every rank's flag reaches ``round_``; dist.DistError (as gloo raises when a peer goes away) if a
        peer's process is gone or after the group's timeout. Spinning answers a peer that is about to arrive within microseconds;
        past SPIN_S the peer is computing (ranks skew by milliseconds), and a napping waiter leaves the core to whatever
        shares it (a rank of 4 on 2 cores, gloo's threads) and costs no CPU time, which the calibration measures."""
        start = watched = time.monotonic()
        while int(self.lines[:, _FLAG].min()) < round_:
            now = time.monotonic()
            if now - start < SPIN_S:
                os.sched_yield()
            else:
                time.sleep(NAP_S)
            if now - watched < WATCH_S:
                continue
            watched = now
            behind = [r for r in range(self.world) if int(self.lines[r, _FLAG]) < round_]
            gone = [r for r in behind if not _alive(int(self.lines[r, _PID]))]
            if gone or now - start > self.wait_s:
                why = "exited" if gone else f"did not arrive in {self.wait_s:.0f} s (the process group's timeout)"
                raise dist.DistError(f"shared-memory collective: rank(s) {gone or behind} of the group {why} while "
                                     f"rank {self.rank} waited (round {round_})")


def group_timeout_s(pg: dist.ProcessGroup) -> float | None:
    """The timeout ``pg``'s CPU (gloo) backend fails a collective after (init_process_group's or new_group's
    ``timeout``); None where torch does not say (a group without a CPU backend: nccl)."""
    try:
        return pg._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError):
        return None


def _open(pg: dist.ProcessGroup, slot_bytes: int, usable: bool) -> SharedGroup | None:
    """Collective: rank 0 makes the file, every rank maps it and marks its line, all agree that every mark shows."""
    size = _file_bytes(dist.get_world_size(pg), slot_bytes)
    offer: list[object] = [None, 0]
    if dist.get_rank(pg) == 0 and usable and size <= MAX_BYTES:
        offer = [_new_file(size), secrets.randbits(48)]
    dist.broadcast_object_list(offer, src=dist.get_global_rank(pg, 0), group=pg)
    path, nonce = offer
    if path is None:
        return None
    group = None
    try:
        if Path(str(path)).exists():  # not on another machine's /dev/shm (mapping would create the file there)
            group = SharedGroup(pg, Path(str(path)), slot_bytes)
            group.lines[group.rank, _MARK] = int(nonce) + group.rank
            group.lines[group.rank, _PID] = os.getpid()
    except (OSError, RuntimeError):
        group = None
    dist.barrier(group=pg)
    seen = group is not None and all(int(group.lines[r, _MARK]) == int(nonce) + r for r in range(group.world))
    agreed = torch.tensor([int(seen)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=pg)
    if dist.get_rank(pg) == 0:
        Path(str(path)).unlink(missing_ok=True)  # every rank has it mapped, or never will
    dist.barrier(group=pg)  # no rank returns before the file is gone
    return group if int(agreed) else None


def _line_int64(world: int) -> int:
    return -(-(_OFFSETS + 2 * (world + 1)) // 8) * 8  # whole 64-byte lines


def _file_bytes(world: int, slot_bytes: int) -> int:
    return world * _line_int64(world) * 8 + 2 * world * slot_bytes


def _bytes(t: Tensor) -> Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.new_empty(0, dtype=torch.uint8)


def _new_file(size_bytes: int) -> str | None:
    """A new file of ``size_bytes`` in /dev/shm, its blocks reserved (a mapped file that cannot grow would fault
    on first write), or None where /dev/shm is missing or too full."""
    path = SHM_DIR / f"embshard-group-{os.getpid()}-{secrets.token_hex(8)}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:
        os.posix_fallocate(fd, 0, size_bytes)
    except OSError:
        path.unlink(missing_ok=True)
        return None
    finally:
        os.close(fd)
    return str(path)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
