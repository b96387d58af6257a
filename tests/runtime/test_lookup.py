"""Single-process checks of the rank-local kernels: updates are counted, forwards are not.

FBGEMM's TBE adds 1 to its step counter in every forward of adam (on CUDA) and of rowwise
adagrad (on CPU too: the same counter code), and hands the result to that forward's backward
as adam's t. Rowwise adagrad on CPU runs that code here, so it shows what the GPU adam path sees.
"""

from __future__ import annotations

import pytest
import torch

from embshard.runtime.lookup import FbgemmKernel, TorchKernel
from embshard.runtime.optim import OptimizerConfig
from embshard.runtime.routing import KernelSpec, Slot

ROWS, DIM = 20, 8


def kernel(impl: str, optimizer: str):
    slot = Slot(0, "t", 0, 0, 0, ROWS, 0, DIM)
    spec = KernelSpec(impl, optimizer, "fp32", (slot,), (slot,), (0,), 0)
    cls = FbgemmKernel if impl == "fbgemm" else TorchKernel
    k = cls(spec, True, ["fp32"], OptimizerConfig(learning_rate=0.1), torch.device("cpu"))
    with torch.no_grad():
        k.block_weights()[0].copy_(torch.linspace(-1, 1, ROWS * DIM).view(ROWS, DIM))
    return k


def bags(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randint(0, ROWS, (12,), generator=gen), torch.tensor([0, 3, 3, 7, 12])


def train(k, steps: int, eval_forwards: bool) -> None:
    for step in range(steps):
        indices, offsets = bags(step)
        (k(indices, offsets) ** 2).sum().backward()
        if eval_forwards:
            with torch.no_grad():
                k(*bags(100 + step))
            k(*bags(200 + step))  # a graph that is never backpropagated (an eval forward without no_grad)


@pytest.mark.parametrize("impl,optimizer", [("fbgemm", "rowwise_adagrad"), ("torch", "adam")])
def test_forwards_between_updates_change_nothing(impl: str, optimizer: str) -> None:
    plain, interleaved = kernel(impl, optimizer), kernel(impl, optimizer)
    train(plain, 3, eval_forwards=False)
    train(interleaved, 3, eval_forwards=True)
    assert int(interleaved.step) == int(plain.step) == 3
    assert torch.equal(interleaved.block_weights()[0], plain.block_weights()[0])
    for name, value in plain.block_states()[0].items():
        assert torch.equal(interleaved.block_states()[0][name], value), name


def test_fbgemm_hands_each_update_its_update_count_as_t() -> None:
    """After 2 updates and 4 eval forwards, the next forward's update is t = 3 (FBGEMM alone would say 7)."""
    k = kernel("fbgemm", "rowwise_adagrad")
    train(k, 2, eval_forwards=True)
    out = k(*bags(2))
    assert int(k.tbe.iter_cpu) == 3 and int(k.tbe.iter) == 3
    out.sum().backward()
    assert int(k.step) == 3
    assert k.count_update() == 4  # an update applied outside backward (DenseReplicas) counts once
