"""embshard.models.linear.Linear: nn.Linear's outputs and gradients, its state-dict keys."""

from __future__ import annotations

import pytest
import torch

from embshard.models.linear import Linear


@pytest.mark.parametrize("in_features", [13, 367, 432])
def test_linear_equals_torch_linear_in_outputs_and_every_gradient(in_features: int) -> None:
    torch.manual_seed(0)
    ours, theirs = Linear(in_features, 24), torch.nn.Linear(in_features, 24)
    theirs.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == ["weight", "bias"]
    x, grad = torch.randn(50, in_features), torch.randn(50, 24)
    results = []
    for module in (ours, theirs):
        x_in = x.clone().requires_grad_()
        out = module(x_in)
        out.backward(grad)
        results.append((out, x_in.grad, module.weight.grad, module.bias.grad))
    assert results[0][1].abs().sum() > 0
    for a, b in zip(*results):
        assert a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-6)
