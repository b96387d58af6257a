"""DLRM: dot interaction equals TorchRec's torchrec.models.dlrm.DLRM with the same weights (forward and gradients);
DCNv2 and sequence variants run and train; target attention equals a per-sample softmax."""

from __future__ import annotations

import pytest
import torch
from torchrec.models.dlrm import DLRM as TorchRecDLRM

from embshard.data.batch import FeatureLayout
from embshard.data.config import SyntheticConfig
from embshard.data.stream import open_stream
from embshard.models.attention import TargetAttention
from embshard.models.config import DLRMConfig, SequenceConfig
from embshard.models.dlrm import DLRM
from embshard.models.interaction import CrossInteraction
from embshard.specs import TableSpec

TABLES = (TableSpec("a", 40, 8), TableSpec("b", 30, 8, pooling_factor=2.0), TableSpec("c", 50, 8))


def batch(specs, config: DLRMConfig, size: int = 16):
    layout = FeatureLayout.from_specs(specs, max_history_length=config.sequence.max_history_length)
    return next(open_stream(SyntheticConfig(), layout, 0, 1, size, "train"))


def test_dot_interaction_equals_torchrec_dlrm() -> None:
    torch.manual_seed(0)
    config = DLRMConfig(bottom_mlp=(16, 8), top_mlp=(32, 16, 1))
    ours = DLRM(config, TABLES, 13)
    theirs = TorchRecDLRM(embedding_bag_collection=ours.sparse, dense_in_features=13, dense_arch_layer_sizes=[16, 8],
                          over_arch_layer_sizes=[32, 16, 1])
    ours_linear = [m for m in [*ours.bottom, *ours.top] if isinstance(m, torch.nn.Linear)]
    theirs_linear = [m for m in theirs.modules() if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in ours_linear] == [tuple(m.weight.shape) for m in theirs_linear]
    with torch.no_grad():
        for a, b in zip(ours_linear, theirs_linear):
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)
    b = batch(TABLES, config)
    ours_out, theirs_out = ours(b.dense, b.sparse), theirs(b.dense, b.sparse).squeeze(1)
    assert torch.allclose(ours_out, theirs_out, atol=1e-6)
    # Backward too (ours: one bmm on the symmetric gradient of the pair products; theirs: autograd through bmm).
    # The tables are shared: their gradient is the sum of both models' (the second minus the first).
    weights = torch.randn(ours_out.shape)
    (ours_out * weights).sum().backward()
    ours_grads = [p.grad.clone() for m in ours_linear for p in (m.weight, m.bias)]
    tables = [t.weight for t in ours.sparse.embedding_bags.values()]
    ours_tables = [t.grad.clone() for t in tables]
    (theirs_out * weights).sum().backward()
    theirs_grads = [p.grad for m in theirs_linear for p in (m.weight, m.bias)]
    assert ours_grads[0].abs().sum() > 0 and ours_tables[0].abs().sum() > 0
    for a, g in zip(ours_grads, theirs_grads):
        assert torch.allclose(a, g, atol=1e-5)
    for a, t in zip(ours_tables, tables):
        assert torch.allclose(a, t.grad - a, atol=1e-5)


@pytest.mark.parametrize("num_layers, chunk_rows", [(2, None), (2, 2), (3, 1), (1, 4)])
def test_cross_interaction_equals_torchrec_low_rank_crossnet(num_layers: int, chunk_rows: int | None) -> None:
    """Whole (one block) or by blocks of chunk_rows samples, the last one short (5 samples): the same outputs and
    gradients as TorchRec's module."""
    torch.manual_seed(0)
    ours = CrossInteraction(12, num_layers=num_layers, low_rank=3)
    if chunk_rows is not None:
        ours.chunk_bytes = chunk_rows * 12 * 4
    dense, embeddings = torch.randn(5, 4, requires_grad=True), torch.randn(5, 8, requires_grad=True)
    weights = torch.randn(5, 12)
    grads = []
    for forward in (lambda: ours(dense, embeddings), lambda: ours.crossnet(torch.cat([dense, embeddings], dim=1))):
        ours.zero_grad()
        dense.grad = embeddings.grad = None
        out = forward()
        (out * weights).sum().backward()
        grads.append([out.detach(), dense.grad, embeddings.grad, *(p.grad.clone() for p in ours.parameters())])
    assert grads[0][1].abs().sum() > 0 and len(grads[0]) == 3 + 3 * num_layers
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5)


def test_dcnv2_takes_any_dims_and_trains() -> None:
    tables = (TableSpec("a", 40, 8), TableSpec("b", 30, 12), TableSpec("c", 50, 4))
    with pytest.raises(ValueError, match=r"dot interaction needs every embedding_dim = model.bottom_mlp\[-1\] = 8, but \['b', 'c'\]"):
        DLRM(DLRMConfig(bottom_mlp=(16, 8), top_mlp=(8, 1)), tables, 13)
    model = DLRM(DLRMConfig(interaction="dcn", bottom_mlp=(16, 8), top_mlp=(8, 1), dcn_num_layers=2, dcn_low_rank=4),
                 tables, 13)
    b = batch(tables, DLRMConfig())
    out = model(b.dense, b.sparse)
    assert out.shape == (16,)
    torch.nn.functional.binary_cross_entropy_with_logits(out, b.labels).backward()
    assert model.interaction.crossnet.W_kernels[0].grad.abs().sum() > 0
    assert model.sparse.embedding_bags["b"].weight.grad.abs().sum() > 0


def test_sequence_feature_is_pooled_by_attention_and_trains() -> None:
    sequence = SequenceConfig(enabled=True, num_items=60, max_history_length=5)
    config = DLRMConfig(bottom_mlp=(16, 8), top_mlp=(8, 1), sequence=sequence)
    specs = TABLES + (sequence.table_spec(8, "rowwise_adagrad"),)
    model = DLRM(config, specs, 13)
    b = batch(specs, config)
    out = model(b.dense, b.sparse, b.sequence)
    assert out.shape == (16,)
    out.sum().backward()
    assert model.sequence.embeddings["item"].weight.grad.abs().sum() > 0
    assert model.attention.query.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="needs exactly one sequence table with features"):
        DLRM(config, TABLES, 13)
    with pytest.raises(ValueError, match="model.sequence.enabled is false"):
        DLRM(DLRMConfig(bottom_mlp=(16, 8), top_mlp=(8, 1)), specs, 13)


def test_target_attention_is_a_softmax_per_sample() -> None:
    torch.manual_seed(1)
    attention = TargetAttention(4)
    lengths = torch.tensor([3, 0, 1, 2])
    history = torch.randn(int(lengths.sum()), 4)
    target = torch.randn(4, 4)
    got = attention(history, lengths, target)
    start = 0
    for i, n in enumerate(lengths.tolist()):
        h = history[start:start + n]
        start += n
        if n == 0:
            assert torch.equal(got[i], torch.zeros(4))
            continue
        weights = torch.softmax(h @ attention.query(target[i]) / 2.0, dim=0)
        assert torch.allclose(got[i], (weights[:, None] * h).sum(0), atol=1e-6)


def test_bad_model_settings_name_the_key() -> None:
    with pytest.raises(ValueError, match=r"model.top_mlp: the last layer must have width 1"):
        DLRMConfig(top_mlp=(8, 2))
    with pytest.raises(ValueError, match=r"model.interaction: must be one of \['dot', 'dcn'\]"):
        DLRMConfig(interaction="cross")
