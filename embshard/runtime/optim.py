"""Fused embedding optimizers: their settings, and exact torch updates of touched rows.

FBGEMM's table-batched kernels apply the optimizer inside backward. Its CPU build runs
``exact_sgd``, ``exact_adagrad`` and ``exact_row_wise_adagrad`` but not ``adam``; this file
holds the same updates written in torch (FBGEMM's formulas), used by the torch kernel for
adam tables on CPU and for replicated tables whose width FBGEMM rejects. All updates are
"sparse": only rows that appear in the batch change (adam's moments of other rows do not
decay), and ``step`` counts updates of the whole kernel (adam's bias correction).

Column-split tables with rowwise_adagrad keep one accumulator per row and column block (the
mean of squared gradients over the block's columns), as FBGEMM and TorchRec do on each
column shard; every other optimizer and sharding updates exactly as the unsharded table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

OPTIMIZERS = ("sgd", "adagrad", "rowwise_adagrad", "adam")


@dataclass(frozen=True)
class OptimizerConfig:
    """Hyper-parameters shared by every fused embedding optimizer of a collection."""

    learning_rate: float = 0.01
    eps: float = 1.0e-8
    beta1: float = 0.9
    beta2: float = 0.999

    def __post_init__(self) -> None:
        if not self.learning_rate >= 0:
            raise ValueError(f"OptimizerConfig.learning_rate: must be >= 0, got {self.learning_rate!r}")
        if not self.eps > 0:
            raise ValueError(f"OptimizerConfig.eps: must be > 0, got {self.eps!r}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"OptimizerConfig.{name}: must be in [0, 1), got {getattr(self, name)!r}")


def state_shapes(optimizer: str, num_rows: int, dim: int) -> dict[str, tuple[int, ...]]:
    """Optimizer state tensors of one table block, by name (fp32, zero-initialised)."""
    return {
        "sgd": {},
        "adagrad": {"momentum1": (num_rows, dim)},
        "rowwise_adagrad": {"momentum1": (num_rows,)},
        "adam": {"momentum1": (num_rows, dim), "momentum2": (num_rows, dim)},
    }[optimizer]


def apply_update(
    optimizer: str,
    weight: Tensor,
    state: dict[str, Tensor],
    rows: Tensor | None,
    grad: Tensor,
    config: OptimizerConfig,
    learning_rate: float,
    step: int,
) -> None:
    """Update ``weight[rows]`` (and the state's rows) in place from the summed gradient ``grad``.

    rows: unique row indices [U], grad: [U, dim] fp32, duplicates already summed; None: every row
    (grad [rows, dim]; sgd, adagrad and rowwise_adagrad leave a row of zero gradient as it was).
    """
    def take(t: Tensor) -> Tensor:
        return t if rows is None else t.index_select(0, rows)

    def put(t: Tensor, value: Tensor) -> None:
        if rows is None:
            if value is not t:
                t.copy_(value)
        else:
            t.index_copy_(0, rows, value)

    w = take(weight).float()  # every row of an fp32 weight: the weight itself, updated in place
    if optimizer == "sgd":
        w -= learning_rate * grad
    elif optimizer == "adagrad":
        m = take(state["momentum1"]) + grad * grad
        put(state["momentum1"], m)
        w -= learning_rate * grad / (m.sqrt() + config.eps)
    elif optimizer == "rowwise_adagrad":
        if rows is None:  # every row (dense replicas): state and weight in place, no temporary of the weight's size
            m = state["momentum1"].add_((grad * grad).mean(dim=1))
            w.addcmul_((learning_rate / (m.sqrt() + config.eps)).unsqueeze(1), grad, value=-1.0)
        else:
            m = take(state["momentum1"]) + (grad * grad).mean(dim=1)
            put(state["momentum1"], m)
            w -= (learning_rate / (m.sqrt() + config.eps)).unsqueeze(1) * grad
    elif optimizer == "adam":
        m1 = take(state["momentum1"]) * config.beta1 + (1.0 - config.beta1) * grad
        m2 = take(state["momentum2"]) * config.beta2 + (1.0 - config.beta2) * grad * grad
        put(state["momentum1"], m1)
        put(state["momentum2"], m2)
        m1_hat = m1 / (1.0 - config.beta1**step)
        m2_hat = m2 / (1.0 - config.beta2**step)
        w -= learning_rate * m1_hat / (m2_hat.sqrt() + config.eps)
    else:
        raise AssertionError(f"unknown optimizer {optimizer!r}")
    put(weight, w.to(weight.dtype))


def new_state(optimizer: str, num_rows: int, dim: int, device: torch.device) -> dict[str, Tensor]:
    return {name: torch.zeros(shape, device=device) for name, shape in state_shapes(optimizer, num_rows, dim).items()}
