"""Data-parallel tables trained DDP-style (``data_parallel_mode="allreduce"``).

Each rank looks up only its own samples in its replica (`InputDist.local`, nothing travels
in forward; pooled FBGEMM kernels of one width by FBGEMM's dense kernel, whose backward gives the
weight gradient, as TorchRec's DDP tables do). Backward takes that gradient, or scatter-adds the
output gradients into every replica's dense weight gradient, all-reduces them for all such tables of the collection in ONE flat buffer, divides
the gradient by the world size (DDP's average) and applies each table's optimizer to all its
rows, all blocks of one kernel and width at once (the all-reduce in the plan's
``comms.dp_allreduce`` dtype, embshard.runtime.wire; the all-reduce starts in backward and the optimizer runs
when backward ends, an autograd-engine callback as DDP's, so the rest of backward overlaps the all-reduce):
the same update, on every replica, as the
replicated look-up (``"replicated_lookup"``, see collection.py), which instead ships ids and
pooled gradients and looks up the global batch on every rank. A row of zero gradient (no rank
looked it up, or its gradients cancel) is unchanged by sgd, adagrad and rowwise_adagrad; adam
moves a looked-up one (its moments decay), so adam tables also all-reduce a count of ids per
row and update the rows counted (`embshard.specs.dp_allreduce_floats_per_row`).

Across hosts (``sparse``: the plan topology has several, `embshard.specs.sparse_dp_allreduce`, and a table is not
small, `embshard.specs.sparse_dp_table`) only the rows some rank looked up are exchanged and updated: the ranks sum a
mask of the rows they hit (embshard.runtime.row_union; started in forward), then all-reduce those rows' gradient in a
compact buffer (a whole block's where most of its rows were looked up or it is small; adam needs no counts: the
mask's rows are the rows counted). 2 hosts x 2 ranks, 2 Gbit/s, the runtime benchmark's
data_parallel small (18 tables, 47k rows, 27% looked up): 52,777 -> 75,745 samples/s at 18e05c2 (every table
masked; 73,121 in results/runtime.md at 825c302, its four tables of 256 KiB or more masked). On one host, where the sum runs
through shared memory, the mask's extra collective and the index work cost more than the bytes save (the same case
on 2 ranks, 43% looked up: 439k and 399k samples/s whole, 386k and 342k sparse, paired runs).

Sharded update (``sharded=True``, the plan topology's ``sharded_dp_update``; Xu et al.'s
cross-replica sharding): the same buffer is reduce-scattered instead, each table's rows cut in
W pieces (as ``torch.tensor_split``; a rank's share padded to rank
0's: `embshard.specs.sharded_segment_floats`); each rank applies the optimizer to its pieces, keeps only their optimizer state (the
kernels look up, built without state), and the updated rows are all-gathered in fp32, so every
replica ends the step with the same weights as the plain all-reduce gives. A checkpoint gathers
each table's state whole (`table_state`). Cheaper for small tables; priced by `embshard.planner.cost.perf.data_parallel_perf`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.autograd import Variable

from embshard.comms import CommsPrecision
from embshard.runtime.input_dist import Received
from embshard.runtime.lookup import FbgemmKernel
from embshard.runtime.comm import all_gather
from embshard.runtime.optim import OptimizerConfig, apply_update, new_state
from embshard.runtime.replica_layout import Piece, Stack, Unit, row_pieces, slot_first_rows, stack_layout, update_plan, width_runs
from embshard.runtime.routing import KernelSpec
from embshard.runtime.row_union import Pending, RowUnion
from embshard.runtime.wire import wire_all_reduce_pieces_, wire_reduce_scatter
from embshard.specs import ZERO_GRADIENT_MOVES, sparse_dp_table

# The all-reduce runs in this many pieces at once, each stack's rows updated as soon as their piece lands: on gloo
# its two worker threads carry two at once, and the update of the first overlaps the second (data_parallel small,
# 2 ranks on 2 cores, 3 MB: 17.9 -> 16.1 and 18.4 -> 17.0 ms a step, interleaved medians of 80). Buffers under PIECE_MIN_FLOATS a piece
# go in fewer.
ALLREDUCE_PIECES = 2
PIECE_MIN_FLOATS = 1 << 18


class DenseReplicas:
    """The replica kernels of one collection, looked up locally and updated after one all-reduce."""

    def __init__(self, kernels: Sequence[nn.Module], specs: Sequence[KernelSpec], pooled: bool,
                 config: OptimizerConfig, pg: dist.ProcessGroup, comms: CommsPrecision = CommsPrecision(),
                 sharded: bool = False, sparse: bool = False) -> None:
        self.kernels, self.specs, self.pooled, self.config, self.pg = list(kernels), list(specs), pooled, config, pg
        self.comms, self.sharded = comms, sharded
        self.rank, self.world = dist.get_rank(pg), dist.get_world_size(pg)
        self.learning_rate = config.learning_rate
        # Not an nn.Parameter of any module (DDP must not wait for it): it only makes backward run.
        self.placeholder = torch.zeros(0, requires_grad=True, device=_device(self.kernels))
        # kernels whose weight gradient FBGEMM's dense backward gives (`FbgemmKernel.dense_lookup`; nothing counted): their
        # stacks are runs of blocks in the kernel's order, so the gradient goes into the buffer as it is (8 tables of 3
        # widths, 2 ranks of 8,192 samples: 745 ms a step by scatter-adding the per-id gradients into stacks by width,
        # 544 with FBGEMM's gradient copied into them block by block, the copy then saved)
        self.dense_grad = [isinstance(k, FbgemmKernel) and k.has_dense_lookup and spec.optimizer not in ZERO_GRADIENT_MOVES
                           for k, spec in zip(self.kernels, self.specs)]
        # across hosts (``sparse``), a mask of the rows looked up where a table is not small (else the old path whole)
        sparse = sparse and any(sparse_dp_table(b.num_rows, b.num_cols, spec.optimizer) for spec in self.specs
                                for b in spec.blocks)
        self.stacks, self.grad_numel, self.flat_numel = stack_layout(self.specs, self.dense_grad, counted=not sparse)
        self._params: dict[int, tuple[list[Tensor], list[dict[str, Tensor]], list[int]]] = {}  # `_stack_params`
        # the all-reduce in pieces, all in flight at once, each stack's rows updated as their piece lands
        self.cuts, self.units = update_plan(self.stacks, self.grad_numel, self.flat_numel, ALLREDUCE_PIECES,
                                              PIECE_MIN_FLOATS)
        # per kernel of per-id gradients: each slot's first row in its width's stack
        self.slot_base = [None if dense else torch.tensor(slot_first_rows(spec), dtype=torch.int64, device=self.placeholder.device)
                          for spec, dense in zip(self.specs, self.dense_grad)]
        assert not (sparse and sharded), "a sharded update reduce-scatters every row"
        self.union = RowUnion(self.stacks, self.specs, pooled, self.placeholder.device) if sparse else None
        self.pending: Pending | None = None  # the last look-up's mask, until `start_mask`
        if sharded:
            self.pieces = row_pieces(self.stacks, self.specs, self.world)
            self.segment = sum(p.floats for p in self.pieces if p.rank == 0)
            # this rank's optimizer state: per piece it updates
            self.piece_state = {(p.stack, p.block): new_state(self.specs[self.stacks[p.stack].kernel].optimizer, p.num_rows,
                                                              self.stacks[p.stack].width, self.placeholder.device)
                                for p in self.pieces if p.rank == self.rank}

    def __call__(self, received: Received) -> list[Tensor]:
        """The look-ups; with grad enabled across hosts, the mask of the rows looked up waits for `start_mask`."""
        training = torch.is_grad_enabled()
        self.pending = Pending(self.union, received.inputs, self.pg) if self.union is not None and training else None
        return list(_LocalLookup.apply(self.placeholder, self, received, training, self.pending))

    def start_mask(self) -> None:
        """Start the all-reduce of the last look-up's mask (every rank's batch known good: the header was read)."""
        if self.pending is not None:
            self.pending.start()
            self.pending = None

    def per_id_grads(self, k: int, x, grad: Tensor) -> dict[int, tuple[Tensor, Tensor]]:
        """width -> (row of each id in the kernel's stack of that width [N], its gradient [N, width])."""
        spec, slot_base = self.specs[k], self.slot_base[k]
        if not self.pooled:  # one width; rows flat in [slot][id] order
            counts = torch.tensor([sum(c) for c in x.ids_per_feature_rank], dtype=torch.int64, device=x.indices.device)
            return {spec.dim: (x.indices + torch.repeat_interleave(slot_base, counts, output_size=x.indices.numel()),
                               grad.view(-1, spec.dim))}
        B, T = grad.shape[0], len(spec.slots)
        lengths = x.offsets[1:] - x.offsets[:-1]  # [T * B], slot-major
        slot_width = [s.num_cols for s in spec.slots]
        out = {}
        for w in sorted(set(slot_width)):
            slots = [t for t in range(T) if slot_width[t] == w]
            if len(slots) == T:  # one width: every column, every id
                grad_w, ids, lengths_w, psw, base_w = grad, x.indices, lengths, x.per_sample_weights, slot_base
            else:
                starts = [sum(slot_width[:t]) for t in slots]
                cols = torch.cat([torch.arange(c, c + w, device=grad.device) for c in starts])
                slot_ids = torch.tensor(slots, device=grad.device)
                keep = torch.repeat_interleave(torch.tensor([width == w for width in slot_width], device=grad.device)
                                               .repeat_interleave(B), lengths, output_size=x.indices.numel())
                grad_w, ids, lengths_w = grad.index_select(1, cols), x.indices[keep], lengths.view(T, B)[slot_ids].reshape(-1)
                psw = None if x.per_sample_weights is None else x.per_sample_weights[keep]
                base_w = slot_base.index_select(0, slot_ids)
            n = ids.numel()
            bags = grad_w.reshape(B, len(slots), w).transpose(0, 1).reshape(-1, w)  # [slot * B + sample, w]
            g = torch.repeat_interleave(bags, lengths_w, dim=0, output_size=n)
            if psw is not None:
                g = g * psw.unsqueeze(1)
            out[w] = (ids + torch.repeat_interleave(base_w.repeat_interleave(B), lengths_w, output_size=n), g)
        return out

    def update(self, inputs, grads: Sequence[Tensor], graphs: Sequence[tuple[Tensor, Tensor] | None],
               pending: Pending | None) -> None:
        """Dense gradients (and adam's id counts) of every stack -> one all-reduce (sparse: of the rows some rank
        looked up: ``pending``'s summed mask, `Pending`; sharded: a reduce-scatter) -> each table's optimizer.
        graphs: per kernel, its dense lookup's (output, weights leaf) (`FbgemmKernel.dense_lookup`) or None."""
        if len(self.kernels) == 1 and graphs[0] is not None:
            # the whole buffer is one kernel's dense weight gradient (FBGEMM's backward, nothing counted): all-reduced as it is
            flat = torch.autograd.grad(graphs[0][0], graphs[0][1], grads[0])[0].view(-1)
            assert flat.numel() == self.flat_numel
        else:
            flat = torch.empty(self.flat_numel, device=self.placeholder.device)
            self._fill(flat, inputs, grads, graphs)
        steps = [kernel.count_update() for kernel in self.kernels]
        if self.sharded:
            self._sharded_update(flat, steps)
            return
        rows = self.union.rows(pending()) if pending is not None else None
        if rows and any(r is not None for r in rows):
            self._update_rows_looked_up(flat, rows, steps)
            return
        waits = wire_all_reduce_pieces_(flat, self.cuts, self.pg, self.comms.dp_allreduce)
        # The rest of backward (the sharded tables' output dist and lookups, the bottom MLP) runs while the pieces
        # travel; the updates run when backward ends (as DDP waits for its buckets), before loss.backward() returns.
        Variable._execution_engine.queue_callback(lambda: self._apply_landed(flat, waits, steps))

    def _update_rows_looked_up(self, flat: Tensor, rows: Sequence[Tensor | None], steps: Sequence[int]) -> None:
        """The all-reduce of each stack's given rows (None: all) in a compact buffer, laid out as stacks of those
        rows (`Stack.grad_start` in it), then their optimizer steps as the pieces land."""
        stacks, start = [], 0
        for st, r, block_ends in zip(self.stacks, rows, self.union.block_ends):
            if r is None:
                block_rows = st.block_rows
            else:
                ends = torch.searchsorted(r, block_ends).tolist()
                block_rows = tuple(b - a for a, b in zip([0, *ends], ends))
            stacks.append(Stack(st.kernel, st.width, st.blocks, block_rows, start, -1))
            start += sum(block_rows) * st.width
        if start == 0:  # no rank looked anything up (every rank sees the same mask)
            return
        compact = torch.empty(start, device=flat.device)
        for st, compact_st, r in zip(self.stacks, stacks, rows):
            out = self._grad(compact, compact_st)
            if r is None:
                out.copy_(self._grad(flat, st))
            else:
                torch.index_select(self._grad(flat, st), 0, r, out=out)
        cuts, units = update_plan(stacks, start, start, ALLREDUCE_PIECES, PIECE_MIN_FLOATS)
        waits = wire_all_reduce_pieces_(compact, cuts, self.pg, self.comms.dp_allreduce)
        Variable._execution_engine.queue_callback(lambda: self._apply_landed(compact, waits, steps, stacks, units, rows))

    def _apply_landed(self, flat: Tensor, waits: Sequence[Callable[[], None]], steps: Sequence[int],
                      stacks: Sequence[Stack] | None = None, units: Sequence[Unit] | None = None,
                      rows: Sequence[Tensor | None] | None = None) -> None:
        """Each stack's rows' optimizer step, as soon as the all-reduce pieces they read have landed (``stacks``,
        ``units`` and ``rows``: a compact buffer's, `_update_rows_looked_up`)."""
        stacks, units = stacks or self.stacks, units or self.units
        landed = 0
        with torch.no_grad():
            for unit in units:  # each as soon as the pieces it reads have landed
                while landed <= unit.piece:
                    waits[landed]()
                    landed += 1
                stack_rows = None if rows is None else rows[unit.stack]
                self._update_rows(unit, flat, steps[stacks[unit.stack].kernel], stacks[unit.stack], stack_rows)

    def _update_rows(self, unit: Unit, flat: Tensor, step: int, stack: Stack, rows: Tensor | None) -> None:
        """The optimizer on rows [lo, hi) of one stack (laid out in ``flat`` as ``stack``; ``rows``: the stack rows
        they stand for, None: the stack's own rows), from the all-reduced sum (averaged here)."""
        lo, hi = unit.row_lo, unit.row_hi
        if lo == hi:
            return
        weights, states, block_rows = self._stack_params(unit.stack)
        grad = self._grad(flat, stack)[lo:hi].div_(self.world)
        if rows is not None:
            self._apply_at(self.specs[stack.kernel].optimizer, weights, states, block_rows, rows[lo:hi], grad, step)
            return
        counts = self._count(flat, stack)[lo:hi] if stack.count_start >= 0 else None
        if (lo, hi) != (0, stack.num_rows):  # the blocks' parts in these rows
            parts, start = [], 0
            for w, st, n in zip(weights, states, block_rows):
                a, b = max(lo, start) - start, min(hi, start + n) - start
                if a < b:
                    parts.append((w[a:b], {name: t if name == "step" else t[a:b] for name, t in st.items()}, b - a))
                start += n
            weights, states, block_rows = (list(x) for x in zip(*parts))
        self._apply(self.specs[stack.kernel].optimizer, weights, states, grad, counts, block_rows, step)

    def _apply_at(self, optimizer: str, weights: list[Tensor], states: list[dict[str, Tensor]],
                  block_rows: Sequence[int], rows: Tensor, grad: Tensor, step: int) -> None:
        """The optimizer on the given rows of a stack (ascending), their gradient ``grad``."""
        if len(weights) == 1:
            apply_update(optimizer, weights[0], states[0], rows, grad, self.config, self.learning_rate, step)
            return
        starts = [0]
        for n in block_rows:
            starts.append(starts[-1] + n)
        cuts = torch.searchsorted(rows, torch.tensor(starts, device=rows.device)).tolist()
        for w, st, start, a, b in zip(weights, states, starts, cuts, cuts[1:]):
            if a < b:
                apply_update(optimizer, w, st, rows[a:b] - start, grad[a:b], self.config, self.learning_rate, step)

    def _stack_params(self, k: int) -> tuple[list[Tensor], list[dict[str, Tensor]], list[int]]:
        """Stack k's weights and optimizer states, one view over all its blocks where they lie one after another in
        memory (FBGEMM's and the torch kernel's do), else per block, with the blocks' rows. Kept after the first call
        (the tensors are the kernel's own, updated in place), except for a cached kernel's, which flush its cache."""
        if k in self._params:
            return self._params[k]
        stack = self.stacks[k]
        kernel = self.kernels[stack.kernel]
        all_weights, all_states = kernel.block_weights(), kernel.block_states()
        weights, states = [all_weights[i] for i in stack.blocks], [all_states[i] for i in stack.blocks]
        weight = _stacked(weights)
        state = {name: _stacked([s[name] for s in states]) for name in states[0] if name != "step"}
        out = (weights, states, list(stack.block_rows))
        if weight is not None and all(t is not None for t in state.values()):
            out = ([weight], [{**states[0], **state}], [stack.num_rows])
        if not getattr(kernel, "cached", False):
            self._params[k] = out
        return out

    def _fill(self, flat: Tensor, inputs, grads: Sequence[Tensor], graphs: Sequence[tuple[Tensor, Tensor] | None]) -> None:
        """Write every stack's dense gradient (and adam's id counts) into the flat buffer: every element."""
        stacks = iter(self.stacks)
        for k, (x, grad, graph) in enumerate(zip(inputs, grads, graphs)):
            if graph is not None:  # FBGEMM's dense backward: the kernel's flat weight gradient, its stacks' rows in order
                dense = torch.autograd.grad(graph[0], graph[1], grad)[0].view(-1)
                own = [next(stacks) for _ in width_runs(self.specs[k])]
                assert all(st.kernel == k for st in own) and dense.numel() == sum(st.num_rows * st.width for st in own)
                flat[own[0].grad_start:own[0].grad_start + dense.numel()].copy_(dense)
                continue
            for w, (rows, g) in sorted(self.per_id_grads(k, x, grad).items()):
                stack = next(stacks)
                assert (stack.kernel, stack.width) == (k, w)
                self._grad(flat, stack).zero_().index_put_((rows,), g.float(), accumulate=True)
                if stack.count_start >= 0:
                    self._count(flat, stack).copy_(torch.bincount(rows, minlength=stack.num_rows))

    def _sharded_update(self, flat: Tensor, steps: list[int]) -> None:
        """Reduce-scatter the gradients by pieces, update this rank's pieces, all-gather the updated rows."""
        device, C = flat.device, self.segment
        send = torch.zeros(self.world * C, device=device)
        for p in self.pieces:  # rank-major: rank r's pieces in its segment
            stack = self.stacks[p.stack]
            grad = self._grad(flat, stack)[p.row_start:p.row_start + p.num_rows]
            send[p.rank * C + p.start:p.rank * C + p.start + grad.numel()].copy_(grad.reshape(-1))
            if stack.count_start >= 0:
                count = self._count(flat, stack)[p.row_start:p.row_start + p.num_rows]
                send[p.rank * C + p.start + grad.numel():p.rank * C + p.floats_end].copy_(count)
        mine = wire_reduce_scatter(send, self.pg, self.comms.dp_allreduce)
        gathered = send  # reused: the updated rows come back into it
        own = gathered[self.rank * C:(self.rank + 1) * C]
        own.zero_()
        with torch.no_grad():
            for p in self.pieces:
                if p.rank != self.rank:
                    continue
                stack, spec = self.stacks[p.stack], self.specs[self.stacks[p.stack].kernel]
                weight = self._piece_weight(p)
                n = p.num_rows * stack.width
                grad = mine[p.start:p.start + n].view(p.num_rows, stack.width).div_(self.world)
                counts = mine[p.start + n:p.floats_end] if stack.count_start >= 0 else None
                self._apply(spec.optimizer, [weight], [self.piece_state[(p.stack, p.block)]], grad, counts, [p.num_rows], steps[stack.kernel])
                own[p.start:p.start + n].copy_(weight.reshape(-1))
            all_gather(gathered, own.clone(), self.pg)
            for p in self.pieces:
                if p.rank != self.rank:
                    weight = self._piece_weight(p)
                    weight.copy_(gathered[p.rank * C + p.start:p.rank * C + p.start + weight.numel()].view_as(weight))

    def _piece_weight(self, p: Piece) -> Tensor:
        weights = self.kernels[self.stacks[p.stack].kernel].block_weights()
        block = weights[self.stacks[p.stack].blocks[p.block]]
        return block[p.row_start - p.block_row:p.row_start - p.block_row + p.num_rows]

    def table_state(self, kernel: int, block: int) -> dict[str, Tensor]:
        """Sharded: a block's whole optimizer state, gathered from the ranks' pieces (a collective: every rank
        calls it, in the same order), and adam's step."""
        k, b = self._stack_of(kernel, block)
        parts = [p for p in self.pieces if p.stack == k and p.block == b]
        out = {"step": self.kernels[kernel].step} if self.specs[kernel].optimizer == "adam" else {}
        for name, local in self.piece_state[(k, b)].items():
            rows = max(p.num_rows for p in parts)
            padded = local.new_zeros((rows, *local.shape[1:]))
            padded[:local.shape[0]] = local
            gathered = local.new_empty((self.world * rows, *local.shape[1:]))
            dist.all_gather_into_tensor(gathered, padded, group=self.pg)  # not counted: checkpoints only
            out[name] = torch.cat([gathered[p.rank * rows:p.rank * rows + p.num_rows] for p in parts])
        return out

    def _stack_of(self, kernel: int, block: int) -> tuple[int, int]:
        """(stack, index in its blocks) of a kernel's block."""
        k = next(i for i, st in enumerate(self.stacks) if st.kernel == kernel and block in st.blocks)
        return k, self.stacks[k].blocks.index(block)

    def table_state_buffers(self, kernel: int, block: int) -> dict[str, Tensor]:
        """Sharded: zeroed whole-block state tensors for a checkpoint to load into (then `load_table_state`)."""
        k, b = self._stack_of(kernel, block)
        return new_state(self.specs[kernel].optimizer, self.stacks[k].block_rows[b], self.stacks[k].width, self.placeholder.device)

    def load_table_state(self, kernel: int, block: int, state: dict[str, Tensor]) -> None:
        """Sharded: this rank's pieces of a block's whole optimizer state."""
        k, b = self._stack_of(kernel, block)
        p = next(p for p in self.pieces if p.stack == k and p.block == b and p.rank == self.rank)
        for name, local in self.piece_state[(k, b)].items():
            start = p.row_start - p.block_row
            local.copy_(state[name][start:start + p.num_rows])

    def _apply(self, optimizer: str, weights: list[Tensor], states: list[dict[str, Tensor]], grad: Tensor,
               counts: Tensor | None, block_rows: Sequence[int], step: int) -> None:
        """The optimizer on blocks stacked [rows, width] (one call per weight given, ``block_rows`` rows each): on
        every row (zero gradient: unchanged), or with ``counts`` on the rows looked up."""
        sizes = list(block_rows)
        for i, (w, s, g) in enumerate(zip(weights, states, grad.split(sizes))):
            if counts is None:
                apply_update(optimizer, w, s, None, g, self.config, self.learning_rate, step)
                continue
            rows = counts.split(sizes)[i].nonzero().squeeze(1)
            if rows.numel():
                apply_update(optimizer, w, s, rows, g.index_select(0, rows), self.config, self.learning_rate, step)

    @staticmethod
    def _grad(flat: Tensor, stack: Stack) -> Tensor:
        return flat[stack.grad_start:stack.grad_start + stack.num_rows * stack.width].view(stack.num_rows, stack.width)

    @staticmethod
    def _count(flat: Tensor, stack: Stack) -> Tensor:
        return flat[stack.count_start:stack.count_start + stack.num_rows]


def _stacked(parts: Sequence[Tensor]) -> Tensor | None:
    """One view over tensors that lie one after another in one storage (same trailing shape), else None."""
    first = parts[0]
    for a, b in zip(parts, parts[1:]):
        if not (a.is_contiguous() and b.is_contiguous() and a.shape[1:] == b.shape[1:] and a.dtype == b.dtype
                and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
                and a.storage_offset() + a.numel() == b.storage_offset()):
            return None
    if len(parts) == 1:
        return first
    return first.as_strided((sum(p.shape[0] for p in parts), *first.shape[1:]), first.stride(), first.storage_offset())


class _LocalLookup(torch.autograd.Function):
    """Forward: every replica kernel on this rank's ids (no fused update; with grad enabled, the kernels of
    `DenseReplicas.dense_grad` by FBGEMM's dense kernel). Backward: `DenseReplicas.update`, with the mask of the
    rows looked up across hosts (``pending``, started by then)."""

    @staticmethod
    def forward(ctx, placeholder: Tensor, owner: DenseReplicas, received: Received, training: bool,
                pending: Pending | None):
        ctx.owner, ctx.inputs, ctx.graphs, ctx.pending, outs = owner, received.inputs, [], pending, []
        for kernel, x, dense in zip(owner.kernels, received.inputs, owner.dense_grad):
            graph = kernel.dense_lookup(x.indices, x.offsets, x.per_sample_weights) if dense and training else None
            ctx.graphs.append(graph)
            outs.append(graph[0].detach() if graph else kernel(x.indices, x.offsets, x.per_sample_weights,
                                                                x.ids_per_feature_rank))
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        ctx.owner.update(ctx.inputs, grads, ctx.graphs, ctx.pending)
        return None, None, None, None, None


def _device(kernels: Sequence[nn.Module]) -> torch.device:
    return kernels[0].block_weights()[0].device
