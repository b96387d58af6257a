"""Optimizer settings of a training run (configs/optim/).

Embedding tables train with fused sparse optimizers inside backward (their kind per table
from the tables file, or ``table_optimizer`` for all; hyper-parameters from ``sparse``);
the dense parameters (MLPs, interaction, attention) with a torch optimizer from ``dense``.
Gradient clipping, if set, clips the dense parameters' gradient norm (fused optimizers
consume the embedding gradients inside backward, before any clipping could see them).
``sharded_update`` shards the dense optimizer across the ranks (torch's ZeroRedundancyOptimizer:
DDP still all-reduces the gradients, each rank keeps the state of and updates only its share of
the dense parameters, then broadcasts them), so its state takes 1/W of the memory per rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from embshard.specs import OPTIMIZER_STATE_FLOATS_PER_ROW

DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
TABLE_OPTIMIZERS = tuple(OPTIMIZER_STATE_FLOATS_PER_ROW)


@dataclass(frozen=True)
class DenseOptimConfig:
    name: str = "adagrad"
    learning_rate: float = 0.01
    eps: float = 1e-8
    beta1: float = 0.9  # adam
    beta2: float = 0.999  # adam
    momentum: float = 0.0  # sgd
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in DENSE_OPTIMIZERS:
            raise ValueError(f"optim.dense.name: must be one of {list(DENSE_OPTIMIZERS)}, got {self.name!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"optim.dense.learning_rate: must be > 0, got {self.learning_rate}")


@dataclass(frozen=True)
class SparseOptimConfig:
    """Hyper-parameters of the fused table optimizers (embshard.runtime.OptimizerConfig)."""

    learning_rate: float = 0.05
    eps: float = 1e-8
    beta1: float = 0.9  # adam
    beta2: float = 0.999  # adam

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"optim.sparse.learning_rate: must be > 0, got {self.learning_rate}")


@dataclass(frozen=True)
class OptimConfig:
    dense: DenseOptimConfig = field(default_factory=DenseOptimConfig)
    sparse: SparseOptimConfig = field(default_factory=SparseOptimConfig)
    table_optimizer: str | None = None  # every table's fused optimizer; None keeps each table's own
    clip_grad_norm: float | None = None  # max L2 norm of the dense gradients; None = no clipping
    sharded_update: bool = False  # optimizer state and update sharded across ranks (ZeRO-1): dense layers and all-reduce data-parallel tables; unsharded runs ignore it

    def __post_init__(self) -> None:
        if self.table_optimizer is not None and self.table_optimizer not in TABLE_OPTIMIZERS:
            raise ValueError(f"optim.table_optimizer: must be one of {list(TABLE_OPTIMIZERS)} or null, "
                             f"got {self.table_optimizer!r}")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise ValueError(f"optim.clip_grad_norm: must be > 0 or null, got {self.clip_grad_norm}")
