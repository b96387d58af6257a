"""Gradient clipping: with optim.clip_grad_norm the dense update of a plain-SGD step has norm
learning_rate x the clip (the gradient is larger); without it, the full gradient's."""

from __future__ import annotations

import pytest
import torch

from train_tables import trainer

LEARNING_RATE = 0.5  # configs/optim/sgd.yaml's dense rate


def dense_update_norm(t) -> float:
    before = [p.detach().clone() for _, p in t.dense]
    t.train()
    return float(torch.cat([(p.detach() - b).reshape(-1) for (_, p), b in zip(t.dense, before)]).norm())


@pytest.mark.parametrize("clip", [1e-3, None])
def test_clipping_bounds_the_dense_step(config_dir, tmp_path, clip) -> None:
    t = trainer(config_dir, tmp_path, "optim=sgd", "steps=1", f"optim.clip_grad_norm={'null' if clip is None else clip}")
    norm = dense_update_norm(t)
    if clip is None:
        assert norm > 10 * LEARNING_RATE * 1e-3
    else:
        assert norm == pytest.approx(LEARNING_RATE * clip, rel=1e-3)
