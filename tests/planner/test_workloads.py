"""The DLRM-like table generator: statistics, determinism, and the shipped files it made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embshard.cli import CONFIG_DIR
from embshard.specs import load_tables_file, tables_from_list
from embshard.workloads import generate_tables, tables_yaml

ROOT = Path(__file__).resolve().parents[2]


def test_statistics_are_dlrm_like():
    tables = generate_tables(2000, seed=3)
    rows = np.array([t.num_embeddings for t in tables])
    pooling = np.array([t.pooling_factor for t in tables])
    dims = np.array([t.embedding_dim for t in tables])
    assert len(tables) == 2000 and tables[0].name == "t0000" and tables[-1].name == "t1999"
    assert rows.min() >= 10 and rows.max() <= 4 * 10**7
    assert 0.5 < np.mean(rows < 10**4) < 0.7          # most tables are small
    assert 0.05 < np.mean(rows >= 10**6) < 0.15       # a tail of huge ones
    assert rows.max() > 10**7
    assert 8 <= pooling.mean() <= 16                  # mean ids per sample
    assert np.median(pooling) < pooling.mean() - 3    # right-skewed
    assert pooling.min() >= 1.0 and pooling.max() > 80  # heavy tail
    assert dims.min() >= 16 and dims.max() <= 256 and np.all(dims % 4 == 0)
    assert np.mean(np.isin(dims, [16, 32, 64, 128, 256])) > 0.85
    assert all(t.pooled for t in tables)


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.5, 1.0])
def test_sequence_fraction_is_exact(fraction):
    tables = generate_tables(300, seed=1, sequence_fraction=fraction)
    assert sum(not t.pooled for t in tables) == round(fraction * 300)


def test_mean_pooling_factor_follows_the_argument():
    for mean in (4.0, 12.0, 30.0):
        pooling = np.array([t.pooling_factor for t in generate_tables(4000, seed=0, mean_pooling_factor=mean)])
        assert abs(pooling.mean() - mean) < 0.15 * mean


def test_deterministic_per_seed():
    assert generate_tables(500, seed=7, sequence_fraction=0.2) == generate_tables(500, seed=7, sequence_fraction=0.2)
    assert generate_tables(500, seed=7) != generate_tables(500, seed=8)


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_tables"):
        generate_tables(0)
    with pytest.raises(ValueError, match="sequence_fraction"):
        generate_tables(10, sequence_fraction=1.5)


def test_yaml_round_trips(tmp_path):
    tables = generate_tables(50, seed=2, sequence_fraction=0.3)
    path = tmp_path / "t.yaml"
    path.write_text(tables_yaml(tables, "test"))
    loaded, topology = load_tables_file(path)
    assert loaded == tables and topology is None


def test_large_sets_are_one_text_block_that_round_trips(tmp_path):
    """From 1,000 tables the file holds one string (a header, a line per table): Hydra composes
    5,000 tables in well under a second instead of about 10 s for 5,000 mappings."""
    tables = generate_tables(1000, seed=3, sequence_fraction=0.2)
    text = tables_yaml(tables, "test")
    assert text.splitlines()[2:4] == ["tables: |", "  name num_embeddings embedding_dim pooling_factor pooled dtype optimizer"]
    assert len(text.splitlines()) == 4 + 1000
    path = tmp_path / "t.yaml"
    path.write_text(text)
    loaded, _ = load_tables_file(path)
    assert loaded == tables


@pytest.mark.parametrize("text, message", [
    ("num_embeddings name\nt 10", "the first line must name the columns, 'name' first"),
    ("name num_embeddings embedding_dim\na 10", "table line 1 has 2 values for the 3 columns"),
    ("name num_embeddings embedding_dim\na ten 8", r"tables\[0\] \(a\).num_embeddings: must be a positive integer, got 'ten'"),
    ("name num_embeddings embedding_dim pooled\na 10 8 maybe", r"tables\[0\] \(a\).pooled: must be true"),
    ("# only a comment", "the table text is empty"),
])
def test_bad_table_text_is_rejected(text, message):
    with pytest.raises(ValueError, match=message):
        tables_from_list(text)


@pytest.mark.parametrize("num_tables", [150, 856])
def test_shipped_files_regenerate_identically(num_tables):
    out = subprocess.run(
        [sys.executable, "-m", "embshard.workloads", "--num-tables", str(num_tables), "--seed", "0"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout
    assert out == (Path(CONFIG_DIR) / "tables" / f"dlrm_{num_tables}.yaml").read_text()
