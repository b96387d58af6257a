"""Eval passes: whatever the number of ranks, the ranks' batches together hold every sample of
the eval set exactly once (synthetic: a fixed size; numpy and TSV files: all their samples),
in batches of at most the batch size, the last ones short or empty; nothing wraps around."""

from __future__ import annotations

import numpy as np
import pytest

from embshard.data.batch import FeatureLayout
from embshard.data.config import CriteoNpyConfig, CriteoTsvConfig, SyntheticConfig
from embshard.data.stream import open_eval_pass
from embshard.data.synthetic import SyntheticSource
from embshard.specs import TableSpec

CRITEO = FeatureLayout.from_specs(tuple(TableSpec(f"cat_{i}", 1000 + i, 8) for i in range(26)))
SYNTHETIC = FeatureLayout.from_specs((TableSpec("a", 1000, 8), TableSpec("b", 50, 8, pooling_factor=3.0)))
BATCH = 8


def rank_rows(config, layout: FeatureLayout, world_size: int, num_samples: int = 0) -> list[list[tuple]]:
    """Per rank: (label, dense...) of every sample it evaluates, checking the batch sizes on the way."""
    out = []
    for rank in range(world_size):
        rows = []
        for b in open_eval_pass(config, layout, rank, world_size, BATCH, num_samples):
            assert 0 <= b.size <= BATCH and b.sparse.lengths().numel() == b.size * len(layout.pooled)
            rows += [(float(b.labels[k]), *b.dense[k].tolist()) for k in range(b.size)]
        out.append(rows)
    return out


def check_each_once(per_rank: list[list[tuple]], want: list[tuple]) -> None:
    got = [r for rows in per_rank for r in rows]
    assert len(got) == len(want) and sorted(got) == sorted(want)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_synthetic_eval_set_is_its_first_samples_each_once(world_size: int) -> None:
    config = SyntheticConfig()
    samples = SyntheticSource(config, SYNTHETIC, "eval").read(0, 100)
    want = [(float(samples.labels[k]), *samples.dense[k].tolist()) for k in range(100)]
    per_rank = rank_rows(config, SYNTHETIC, world_size, num_samples=100)
    check_each_once(per_rank, want)
    # every rank takes the same number of steps; at 3 ranks the last global batch (100 - 4 * 24 = 4) leaves two empty
    steps = [len(list(open_eval_pass(config, SYNTHETIC, r, world_size, BATCH, 100))) for r in range(world_size)]
    assert len(set(steps)) == 1 and steps[0] == -(-100 // (BATCH * world_size))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_npy_eval_days_are_read_whole_each_once(tmp_path, world_size: int) -> None:
    rng = np.random.default_rng(0)
    dense = rng.random((21, 13), dtype=np.float32)
    np.save(tmp_path / "day_5_dense.npy", dense)
    np.save(tmp_path / "day_5_sparse.npy", rng.integers(0, 10**6, (21, 26)))
    labels = rng.integers(0, 2, 21)
    np.save(tmp_path / "day_5_labels.npy", labels)
    want = [(float(labels[k]), *dense[k].tolist()) for k in range(21)]
    check_each_once(rank_rows(CriteoNpyConfig(dir=str(tmp_path), eval_days=(5,)), CRITEO, world_size), want)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_tsv_eval_files_are_read_whole_each_once(tmp_path, world_size: int) -> None:
    paths, want = [], []
    for day, n in ((0, 23), (1, 2)):  # the second file is smaller than one batch: some ranks' ranges hold nothing
        lines = ["\t".join([str(i % 2), str(100 * day + i), *["1"] * 12, *[format(i, "x")] * 26]) for i in range(n)]
        (tmp_path / f"day_{day}").write_text("\n".join(lines) + "\n")
        paths.append(str(tmp_path / f"day_{day}"))
        want += [(float(i % 2), float(np.log1p(100 * day + i)), *[float(np.log1p(1))] * 12) for i in range(n)]
    per_rank = rank_rows(CriteoTsvConfig(eval_files=tuple(paths)), CRITEO, world_size)
    got = sorted(r for rows in per_rank for r in rows)
    assert len(got) == 25 and np.allclose(got, sorted(want))
