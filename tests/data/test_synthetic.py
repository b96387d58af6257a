"""Synthetic stream: the same samples whoever reads them, rank slices that tile the global
batch, skewed ids within the tables' rows, and labels that carry the planted signal."""

from __future__ import annotations

import numpy as np
import torch

from embshard.data.batch import FeatureLayout, Samples
from embshard.data.config import SyntheticConfig
from embshard.data.stream import IndexedStream, open_stream
from embshard.data.synthetic import SyntheticSource, hidden_uniform, scatter_ranks, zipf_rows
from embshard.specs import TableSpec

SPECS = (TableSpec("a", 1000, 8), TableSpec("b", 50, 8, pooling_factor=3.0), TableSpec("c", 20_000, 8),
         TableSpec("item", 300, 8, pooling_factor=3.0, pooled=False, feature_names=("history", "target")))
LAYOUT = FeatureLayout.from_specs(SPECS, max_history_length=5)


def same(x: Samples, y: Samples) -> bool:
    return (np.array_equal(x.dense, y.dense) and np.array_equal(x.labels, y.labels)
            and np.array_equal(x.lengths, y.lengths) and all(np.array_equal(a, b) for a, b in zip(x.values, y.values)))


def test_any_slice_is_the_same_samples() -> None:
    source = SyntheticSource(SyntheticConfig(seed=3), LAYOUT)
    whole = source.read(100, 700)
    parts = Samples.concat([source.read(100, 1), source.read(101, 299), source.read(400, 400)])
    assert same(whole, parts)
    assert same(whole, SyntheticSource(SyntheticConfig(seed=3), LAYOUT).read(100, 700))
    assert not np.array_equal(whole.labels, SyntheticSource(SyntheticConfig(seed=4), LAYOUT).read(100, 700).labels)
    assert not np.array_equal(whole.dense, SyntheticSource(SyntheticConfig(seed=3), LAYOUT, "eval").read(100, 700).dense)


def test_rank_slices_tile_the_global_batch() -> None:
    config = SyntheticConfig()
    one = open_stream(config, LAYOUT, 0, 1, 96, "train")
    ranks = [open_stream(config, LAYOUT, r, 3, 32, "train") for r in range(3)]
    for _ in range(3):
        whole = next(one)
        parts = [next(s) for s in ranks]
        assert torch.equal(whole.labels, torch.cat([p.labels for p in parts]))
        assert torch.equal(whole.dense, torch.cat([p.dense for p in parts]))
        for key in ("a", "b", "c"):
            assert torch.equal(whole.sparse[key].values(), torch.cat([p.sparse[key].values() for p in parts]))
            assert torch.equal(whole.sparse[key].lengths(), torch.cat([p.sparse[key].lengths() for p in parts]))
        assert torch.equal(whole.sequence["history"].values(), torch.cat([p.sequence["history"].values() for p in parts]))
    resumed = IndexedStream(SyntheticSource(config, LAYOUT), LAYOUT, 1, 3, 32, samples_consumed=3 * 96)
    assert torch.equal(next(resumed).labels, next(ranks[1]).labels)


def test_ids_skewed_within_rows_and_bags_follow_pooling() -> None:
    s = SyntheticSource(SyntheticConfig(id_skew=1.1), LAYOUT).read(0, 20_000)
    a, b, c, history, target = s.values
    assert a.min() >= 0 and a.max() < 1000 and b.max() < 50 and c.max() < 20_000 and history.max() < 300
    counts = np.sort(np.bincount(c, minlength=20_000))[::-1]
    assert counts[:200].sum() > 0.4 * len(c)  # 1% of the rows take > 40% of the lookups
    assert (s.lengths[0] == 1).all() and abs(s.lengths[1].mean() - 3.0) < 0.1
    assert s.lengths[3].min() == 1 and s.lengths[3].max() == 5 and (s.lengths[4] == 1).all()
    uniform = SyntheticSource(SyntheticConfig(id_skew=0.0), LAYOUT).read(0, 20_000).values[2]
    assert np.sort(np.bincount(uniform, minlength=20_000))[::-1][:200].sum() < 0.12 * len(uniform)


def test_labels_carry_the_planted_signal() -> None:
    s = SyntheticSource(SyntheticConfig(signal=3.0, positive_rate=0.25), LAYOUT).read(0, 20_000)
    assert 0.2 < s.labels.mean() < 0.4
    weight_a = hidden_uniform(0, s.values[0])  # table a's hidden per-row weight
    assert np.corrcoef(weight_a, s.labels)[0, 1] > 0.1
    flat = SyntheticSource(SyntheticConfig(signal=0.0), LAYOUT).read(0, 20_000)
    assert abs(np.corrcoef(hidden_uniform(0, flat.values[0]), flat.labels)[0, 1]) < 0.03


def test_every_row_can_be_drawn() -> None:
    # the rank -> row map is one-to-one (it once wrapped in uint64: a 305-row table drew 25 rows)
    for num_rows in (1, 2, 305, 4096, 1_000_003, 2**33 + 7):
        ranks = np.arange(min(num_rows, 50_000), dtype=np.uint64)
        rows = scatter_ranks(ranks, num_rows, salt=12345)
        assert len(np.unique(rows)) == len(ranks) and 0 <= rows.min() and rows.max() < num_rows, num_rows
    uniform = zipf_rows(np.random.default_rng(0), 305, 0.0, 20_000, salt=7)
    assert len(np.unique(uniform)) == 305
