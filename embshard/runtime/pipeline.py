"""A pipelined input dist, as TorchRec's `TrainPipelineSparseDist` does: while batch k runs its forward
and backward, a side thread reads batch k+1 and runs its input dist (validation, the header
all-gather, the lengths and ids all-to-alls) for every collection that ships ids (below); batch k+1's forward then
starts at its lookups.

The side thread talks over a process group of its own (same ranks, same backend): collectives of one
group must be issued in the same order on every rank, and the main thread's output dist, gradient
all-to-alls and DDP all-reduces interleave with the side thread's at random. That group stays on gloo where
the main one runs through shared memory (one host, `embshard.runtime.comm.use_shared_memory`): a rank waiting
there polls, and a side thread's waits are long (its peers' side threads start at other times), where gloo blocks
in the kernel (DLRM-v2, 2 ranks on 2 cores, one round each, when a wait still spun: pipelined 1.14x TorchRec with
the side group on shared memory, 1.19x on gloo; with the naps of 1802d02, one round each, within noise of gloo). The
results are those of the plain step, bit for bit: the same input dist computed earlier. A collection whose
look-ups are all local (data-parallel tables trained by an all-reduce, `all_local`) is left to its forward: its
input dist ships nothing, and its header, in flight behind its look-ups there, would cost the side thread a
collective and a hand-over for no overlap (the runtime benchmark's data_parallel small, 2 hosts x 2 ranks: at
9dbb23f pipelined 0.93x TorchRec, plain 1.02x; left out since 98cc170, pipelined 49,285 samples/s, plain 48,764).
The side group fails a collective after the main group's timeout, as the main one does. A batch refused by a rank
raises its ValueError on every rank from `next`, as the plain forward does. Serving (embshard/serving/) does not use it: a request batch exists only once its requests have arrived, so there is no next
batch to distribute early without holding the current one back (more latency).

    pipeline = InputPipeline(pg, read=lambda: next(stream), inputs=lambda b: [(model.sparse, b.sparse)])
    batch = pipeline.next()        # read and distributed on the side thread (now, if not prefetched)
    pipeline.prefetch()            # start the next one, then run batch's step
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Generic, Sequence, TypeVar

import torch.distributed as dist
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from embshard.runtime.comm import new_subgroup
from embshard.runtime.input_dist import Distributed

T = TypeVar("T")
Inputs = Callable[[T], Sequence[tuple[nn.Module, KeyedJaggedTensor]]]  # item -> (sharded collection, its features)


class InputPipeline(Generic[T]):
    """``read()``: the next item (a batch); ``inputs(item)``: the collections it goes through, each with its
    features. Creating one is collective (a new process group): every rank of the default group calls it."""

    def __init__(self, pg: dist.ProcessGroup, read: Callable[[], T], inputs: Inputs) -> None:
        self.pg = new_subgroup(pg, dist.get_process_group_ranks(pg), backend=dist.get_backend(pg))
        self.read, self.inputs = read, inputs
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="embshard-input-dist")
        self.pending: Future | None = None

    def prefetch(self) -> None:
        """Start reading and distributing the next item on the side thread."""
        assert self.pending is None, "prefetch: the previous item was not taken with next()"
        self.pending = self.pool.submit(self._prepare)

    def next(self) -> T:
        """The next item, its input dist staged in its collections (their next forward of it skips that part)."""
        if self.pending is None:
            self.prefetch()
        assert self.pending is not None
        pending, self.pending = self.pending, None
        item, staged = pending.result()
        for collection, features, distributed in staged:
            collection.stage(features, distributed)
        return item

    def close(self) -> None:
        """Wait for the side thread (an item still in flight is dropped) and release the group."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending = None
        dist.destroy_process_group(self.pg)

    def _prepare(self) -> tuple[T, list[tuple[nn.Module, KeyedJaggedTensor, Distributed]]]:
        item = self.read()
        return item, [(c, features, c.distribute(features, self.pg)) for c, features in self.inputs(item) if not c.all_local]
