"""Criteo readers on small files written here: the raw tab-separated day files (rank byte
ranges, hashing, malformed lines) and TorchRec's numpy layout."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from embshard.data.batch import FeatureLayout
from embshard.data.config import CriteoNpyConfig, CriteoTsvConfig
from embshard.data.criteo_tsv import TsvStream
from embshard.data.stream import open_stream
from embshard.specs import TableSpec

SPECS = tuple(TableSpec(f"cat_{i}", 1000 + i, 8) for i in range(26))
LAYOUT = FeatureLayout.from_specs(SPECS)


def line(i: int, label: str | None = None) -> str:
    dense = [str(i + j) if j != 3 else "" for j in range(13)]  # one missing dense value
    cats = [format(i * 7919 + j, "08x") if j != 5 else "" for j in range(26)]  # one missing categorical
    return "\t".join([label if label is not None else str(i % 2), *dense, *cats])


def expected(i: int) -> tuple[float, list[float], list[int]]:
    dense = [math.log1p(i + j) if j != 3 else 0.0 for j in range(13)]
    ids = [(i * 7919 + j) % (1000 + j) if j != 5 else 0 for j in range(26)]
    return float(i % 2), dense, ids


@pytest.fixture
def day_files(tmp_path):
    paths = []
    for d in range(2):
        rows = [line(100 * d + i) for i in range(37)]
        (tmp_path / f"day_{d}").write_text("\n".join(rows) + "\n")
        paths.append(str(tmp_path / f"day_{d}"))
    return paths


def collect(stream: TsvStream, n: int) -> list[tuple]:
    out = []
    for _ in range(n):
        b = next(stream)
        ids = torch.stack([b.sparse[f"cat_{j}"].values() for j in range(26)], 1)
        out += [(float(b.labels[k]), b.dense[k].tolist(), ids[k].tolist()) for k in range(b.size)]
    return out


def test_rank_byte_ranges_cover_every_line_once(day_files) -> None:
    ranks_of: dict[tuple, list[int]] = {}
    for rank in range(3):
        stream = TsvStream(tuple(day_files), LAYOUT, rank, 3, 1)
        while True:
            sample = collect(stream, 1)[0]
            if stream.epoch:  # wrapped around to the start of its share
                break
            ranks_of.setdefault(tuple(sample[2]), []).append(rank)
    want = {tuple(expected(100 * d + i)[2]) for d in range(2) for i in range(37)}
    assert set(ranks_of) == want  # together, the ranks read every line of both files
    assert all(len(r) == 1 for r in ranks_of.values())  # and no line twice
    assert sorted(len([k for k, r in ranks_of.items() if r == [rank]]) for rank in range(3)) in ([24, 25, 25], [24, 24, 26])


def test_values_are_parsed_and_hashed_into_rows(day_files) -> None:
    got = collect(TsvStream(tuple(day_files[:1]), LAYOUT, 0, 1, 37), 1)
    for i, (label, dense, ids) in enumerate(got):
        want_label, want_dense, want_ids = expected(i)
        assert label == want_label and ids == want_ids
        assert np.allclose(dense, want_dense, atol=1e-6)


def test_malformed_lines_are_counted_and_skipped_or_stop_in_strict_mode(tmp_path) -> None:
    rows = [line(0), "1\t2\t3", line(1, label="x"), line(2).replace("0000", "zz00", 1), line(3), line(4)]
    path = tmp_path / "bad.tsv"
    path.write_text("\n".join(rows) + "\n")
    stream = TsvStream((str(path),), LAYOUT, 0, 1, 3)
    got = collect(stream, 1)
    assert [x[2] for x in got] == [expected(i)[2] for i in (0, 3, 4)]
    assert stream.malformed.count == 3
    assert "expected 40 tab-separated fields, got 3" in stream.malformed.examples[0]
    assert "label must be 0 or 1" in stream.malformed.examples[1]
    assert "not hexadecimal" in stream.malformed.examples[2] and "byte" in stream.malformed.examples[2]
    strict = TsvStream((str(path),), LAYOUT, 0, 1, 3, strict=True)
    with pytest.raises(ValueError, match=r"bad.tsv byte \d+: expected 40 tab-separated fields, got 3; .*data.strict=false"):
        next(strict)


def test_position_resumes_exactly_and_other_world_sizes_skip_their_share(day_files) -> None:
    stream = TsvStream(tuple(day_files), LAYOUT, 1, 2, 5)
    collect(stream, 3)
    position = stream.position()
    rest = collect(stream, 4)
    resumed = TsvStream(tuple(day_files), LAYOUT, 1, 2, 5, position=position)
    assert collect(resumed, 4) == rest
    skipped = open_stream(CriteoTsvConfig(train_files=tuple(day_files)), LAYOUT, 0, 1, 5, "train", samples_consumed=7)
    assert collect(skipped, 1)[0][2] == expected(7)[2]


def test_all_lines_malformed_or_missing_files_are_refused(tmp_path) -> None:
    path = tmp_path / "junk.tsv"
    path.write_text("garbage\n" * 5)
    with pytest.raises(ValueError, match="every line of rank 0's share .* is malformed"):
        next(TsvStream((str(path),), LAYOUT, 0, 1, 2))
    with pytest.raises(ValueError, match="cannot read Criteo file"):
        TsvStream((str(tmp_path / "nope"),), LAYOUT, 0, 1, 2)
    with pytest.raises(ValueError, match=rf"data.eval_files\[1\]: {tmp_path} is a directory, not a Criteo day file"):
        TsvStream((str(path), str(tmp_path)), LAYOUT, 0, 1, 2, key="data.eval_files")
    with pytest.raises(ValueError, match="Criteo has 13 dense and 26 categorical"):
        TsvStream((str(path),), FeatureLayout.from_specs(SPECS[:3]), 0, 1, 2)


def write_npy_day(root, day: int, n: int, labels=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(day)
    dense = rng.random((n, 13), dtype=np.float32)
    sparse = rng.integers(0, 10**9, (n, 26))
    labels = rng.integers(0, 2, (n, 1)).astype(np.int32) if labels is None else labels
    np.save(root / f"day_{day}_dense.npy", dense)
    np.save(root / f"day_{day}_sparse.npy", sparse)
    np.save(root / f"day_{day}_labels.npy", labels)
    return dense, sparse, labels


def test_npy_ranks_read_their_slices_across_days(tmp_path) -> None:
    d0 = write_npy_day(tmp_path, 0, 10)
    d1 = write_npy_day(tmp_path, 1, 14)
    dense, sparse, labels = (np.concatenate([a, b]) for a, b in zip(d0, d1))
    config = CriteoNpyConfig(dir=str(tmp_path), train_days=(0, 1), eval_days=(1,))
    streams = [open_stream(config, LAYOUT, r, 2, 4, "train") for r in range(2)]
    for step in range(4):  # 4 global batches of 8 = 32 samples: wraps after 24
        for r, s in enumerate(streams):
            b = next(s)
            rows = [(step * 8 + r * 4 + k) % 24 for k in range(4)]
            assert np.allclose(b.dense.numpy(), dense[rows])
            assert b.labels.tolist() == labels[rows, 0].astype(float).tolist()
            assert b.sparse["cat_7"].values().tolist() == (sparse[rows, 7] % 1007).tolist()
    eval_batch = next(open_stream(config, LAYOUT, 0, 1, 3, "eval"))
    assert np.allclose(eval_batch.dense.numpy(), d1[0][:3])


def test_npy_malformed_rows_and_bad_files(tmp_path) -> None:
    labels = np.array([[0], [1], [2], [1], [0], [1]], dtype=np.int32)
    write_npy_day(tmp_path, 0, 6, labels)
    stream = open_stream(CriteoNpyConfig(dir=str(tmp_path)), LAYOUT, 0, 1, 6, "train")
    assert next(stream).size == 5 and stream.malformed.count == 1
    assert "day_0 row 2: label must be 0 or 1" in stream.malformed.examples[0]
    with pytest.raises(ValueError, match="row 2: label must be 0 or 1"):
        next(open_stream(CriteoNpyConfig(dir=str(tmp_path), strict=True), LAYOUT, 0, 1, 6, "train"))
    np.save(tmp_path / "day_0_dense.npy", np.zeros((6, 12), np.float32))
    with pytest.raises(ValueError, match=r"day 0 in .*: dense has shape \(6, 12\), expected \[N, 13\]"):
        open_stream(CriteoNpyConfig(dir=str(tmp_path)), LAYOUT, 0, 1, 6, "train")
    with pytest.raises(ValueError, match="cannot read .*day_5_dense.npy"):
        open_stream(CriteoNpyConfig(dir=str(tmp_path), train_days=(5,)), LAYOUT, 0, 1, 6, "train")
