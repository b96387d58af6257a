"""embshard-stats: curves of Zipf streams against the Zipf pmf (exact counts and the sketch), exact pooling
factors, memory independent of the stream's length, the CLI end to end (its tables file plans and trains),
and hot_rows validation (bad curves refused; specs without it hash as before)."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from rich.console import Console

from embshard.cli import CONFIG_DIR
from embshard.data.config import CriteoNpyConfig, CriteoTsvConfig, SyntheticConfig
from embshard.plan_cli import run as plan_run
from embshard.planner.plan import ShardingPlan, input_hash
from embshard.specs import TableSpec, load_tables_file
from embshard.stats.counters import ExactCounter, SketchCounter
from embshard.stats.hot_ids import read_hot_ids
from embshard.stats.measure import HOT_FRACTIONS, TableAccumulator, max_hot_rows, measure
from embshard.topology import Topology
from embshard.train import config as train_config

CLI = [sys.executable, "-m", "embshard.stats.cli"]  # the embshard-stats console script, installed or not
ZIPF = [(0.8, 1_000), (1.1, 10_000), (1.3, 100_000)]  # (exponent, rows)
LOOKUPS = 1_000_000


def zipf_pmf(s: float, rows: int) -> np.ndarray:
    p = 1.0 / np.arange(1, rows + 1) ** s
    return p / p.sum()


def zipf_curve(s: float, rows: int) -> np.ndarray:
    """Fraction of the lookups that go to the hottest f x rows rows, from the pmf (linear between rows)."""
    cumulative = np.concatenate([[0.0], np.cumsum(zipf_pmf(s, rows))])
    return np.interp(np.array(HOT_FRACTIONS) * rows, np.arange(rows + 1), cumulative)


def zipf_ids(s: float, rows: int, n: int, seed: int) -> np.ndarray:
    """n ids of a Zipf(s) law, ranks scattered over the rows."""
    rng = np.random.default_rng(seed)
    return rng.permutation(rows)[rng.choice(rows, n, p=zipf_pmf(s, rows))]


@pytest.fixture(scope="module")
def streams() -> dict[tuple[float, int], np.ndarray]:
    return {(s, rows): zipf_ids(s, rows, LOOKUPS, seed=i) for i, (s, rows) in enumerate(ZIPF)}


def feed(acc: TableAccumulator, ids: np.ndarray, batch: int = 50_000) -> np.ndarray:
    """Bags of lengths 0, 1, 2, 3, 0, 1, ... (mean 1.5, a quarter empty) holding ``ids``, fed in batches; the lengths."""
    lengths = np.resize(np.array([0, 1, 2, 3]), 2 * len(ids) // 3)
    lengths[-1] += len(ids) - lengths.sum()
    ends = np.cumsum(lengths)
    for start in range(0, len(lengths), batch):
        chunk = lengths[start:start + batch]
        first = ends[start] - chunk[0]
        acc.add(chunk, ids[first:first + chunk.sum()])
    return lengths


@pytest.mark.parametrize("s,rows", ZIPF, ids=[f"s={s}-rows={r}" for s, r in ZIPF])
def test_exact_counts_give_the_zipf_curve_and_exact_pooling(streams, s: float, rows: int) -> None:
    acc = TableAccumulator(TableSpec("t", rows, 8), exact_max_rows=rows, sketch_rows=rows // 10)
    lengths = feed(acc, streams[s, rows])
    stats = acc.result(len(lengths), HOT_FRACTIONS)
    assert stats.method == "exact"
    assert stats.pooling_factor == lengths.mean() == pytest.approx(1.5, abs=1e-5)
    assert stats.pooling_std == pytest.approx(lengths.std(), rel=1e-9)
    assert stats.empty_bag_share == np.mean(lengths == 0) == pytest.approx(0.25, abs=1e-5)
    assert stats.distinct_rows == len(np.unique(streams[s, rows]))
    assert [f for f, _ in stats.hot_rows] == list(HOT_FRACTIONS)
    np.testing.assert_allclose([x for _, x in stats.hot_rows], zipf_curve(s, rows), atol=0.02)


@pytest.mark.parametrize("s,rows", ZIPF, ids=[f"s={s}-rows={r}" for s, r in ZIPF])
def test_sketch_curve_is_close_to_exact_counts_and_the_pmf(streams, s: float, rows: int) -> None:
    """sketch_rows = rows / 10: within 0.01 of the exact counts of the same stream (module docstring)."""
    ids = streams[s, rows]
    exact, sketch = ExactCounter(rows), SketchCounter(rows, rows // 10)
    exact.add(ids)
    for start in range(0, len(ids), 50_000):
        sketch.add(ids[start:start + 50_000])
    assert sketch.method.startswith("sketch")
    np.testing.assert_allclose(sketch.curve(HOT_FRACTIONS), exact.curve(HOT_FRACTIONS), atol=0.01)
    np.testing.assert_allclose(sketch.curve(HOT_FRACTIONS), zipf_curve(s, rows), atol=0.025)
    assert sketch.distinct_rows() == pytest.approx(exact.distinct_rows(), rel=0.05)


def test_sketch_memory_does_not_grow_with_the_stream() -> None:
    rows, sketch_rows = 1_000_000, 10_000
    sketch = SketchCounter(rows, sketch_rows)
    sizes = []
    for part in range(6):
        sketch.add(zipf_ids(1.1, rows, 200_000, seed=10 + part) if part < 5 else np.arange(rows))  # then every row once
        sketch.curve(HOT_FRACTIONS)  # folds the buffer in
        sizes.append(sketch.memory_entries())
    assert max(sizes) <= 3 * sketch_rows, sizes  # 1.2 M lookups over a million rows, 30,000 entries at most
    assert len(sketch.heavy_keys) <= sketch_rows
    assert ExactCounter(5_000).counts.shape == (5_000,)


def criteo_specs(num_rows: int = 100) -> list[TableSpec]:
    return [TableSpec(f"cat_{i}", num_rows + i, 8) for i in range(26)]


def exact_curve(ids: np.ndarray, rows: int) -> tuple[float, ...]:
    """The curve that exact counts of ``ids`` give (the estimator of embshard.stats.tail over them)."""
    counter = ExactCounter(rows)
    counter.add(ids)
    return counter.curve(HOT_FRACTIONS)


def test_criteo_readers_map_values_to_rows_as_training_does(tmp_path) -> None:
    """criteo_npy: value % rows over the days in order; criteo_tsv: int(hex, 16) % rows; num_samples caps both."""
    rng = np.random.default_rng(0)
    sparse = rng.zipf(1.5, (2, 60, 26)).astype(np.int64) * 7919
    for day in (0, 1):
        np.save(tmp_path / f"day_{day}_dense.npy", rng.random((60, 13), dtype=np.float32))
        np.save(tmp_path / f"day_{day}_sparse.npy", sparse[day])
        np.save(tmp_path / f"day_{day}_labels.npy", rng.integers(0, 2, 60))
    tsv = tmp_path / "day_0.tsv"
    tsv.write_text("".join("\t".join(["1", *["3"] * 13, *(f"{v:x}" for v in row)]) + "\n" for row in sparse[0]))
    specs = criteo_specs()
    for data, n, expected in [(CriteoNpyConfig(dir=str(tmp_path), train_days=(0, 1)), 1000, sparse.reshape(120, 26)),
                              (CriteoTsvConfig(train_files=(str(tsv),)), 50, sparse[0][:50])]:
        stats = measure(specs, data, n, 16, exact_max_rows=1000, sketch_rows=10)
        for i, spec in enumerate(specs):
            ids = expected[:, i] % spec.num_embeddings
            got = stats[spec.name]
            assert (got.num_samples, got.num_lookups, got.pooling_factor) == (len(expected), len(expected), 1.0)
            assert got.distinct_rows == len(np.unique(ids))
            np.testing.assert_allclose([x for _, x in got.hot_rows], exact_curve(ids, spec.num_embeddings), atol=1e-12)


def test_sequence_tables_refused() -> None:
    specs = [TableSpec("t", 100, 8), TableSpec("history", 100, 8, pooled=False)]
    with pytest.raises(ValueError, match=r"\['history'\] are sequence tables"):
        measure(specs, SyntheticConfig(), 10, 10, exact_max_rows=100, sketch_rows=10)


def test_hot_rows_validated_with_table_and_field_named() -> None:
    base = {"name": "cat_3", "num_embeddings": 100, "embedding_dim": 8}
    good = TableSpec.from_dict({**base, "hot_rows": [[0.01, 0.3], [0.1, 0.3], [1, 1]]})
    assert good.hot_rows == ((0.01, 0.3), (0.1, 0.3), (1.0, 1.0))
    for bad, says in [([[0.1, 0.5], [0.1, 0.6]], "does not increase"), ([[0.2, 0.6], [0.1, 0.7]], "does not increase"),
                      ([[0.1, 0.6], [0.2, 0.5]], "decreases"), ([[0.5, 0.4]], "fewer lookups"),
                      ([[0.1, 1.5]], "leaves [0, 1]"), ([[-0.1, 0.5]], "leaves [0, 1]"), ([[0.1]], "a pair"),
                      ([], "non-empty"), ("hot", "non-empty")]:
        with pytest.raises(ValueError, match=r"tables\[0\] \(cat_3\)\.hot_rows") as e:
            TableSpec.from_dict({**base, "hot_rows": bad}, "tables[0]")
        assert says in str(e.value)


def test_specs_without_hot_rows_hash_and_serialise_as_before() -> None:
    spec = TableSpec("t", 1000, 16, 2.0, feature_names=("a", "b"))
    # The input hash of this spec on a 2-rank topology, computed before TableSpec had hot_rows.
    before = "sha256:1cb56f3316ac6fdf4697392193b70957f1bcb5291df8e886062ce4de32f9211d"
    topology = Topology.from_dict({"world_size": 2})
    assert "hot_rows" not in spec.to_dict()
    assert input_hash([spec], topology, "c") == before
    measured = TableSpec.from_dict({**spec.to_dict(), "hot_rows": [[0.1, 0.9]]})
    assert input_hash([measured], topology, "c") != before


def test_hottest_ids_are_the_most_counted_rows(streams) -> None:
    ids = streams[(1.1, 10_000)]
    exact, sketch = ExactCounter(10_000), SketchCounter(10_000, 1_000)
    for counter in (exact, sketch):
        for start in range(0, len(ids), 100_000):
            counter.add(ids[start:start + 100_000])
    counts = np.bincount(ids, minlength=10_000)
    top = exact.hottest(50)
    assert list(counts[top]) == sorted(counts, reverse=True)[:50] and len(set(top.tolist())) == 50
    assert set(sketch.hottest(20).tolist()) == set(top[:20].tolist())  # the heavy hitters are known exactly enough


def test_plan_json_carries_hot_rows(tmp_path) -> None:
    from embshard import planner

    spec = TableSpec.from_dict({"name": "t", "num_embeddings": 1000, "embedding_dim": 16, "hot_rows": [[0.01, 0.5], [0.5, 0.99]]})
    plan = planner.plan([spec], Topology.from_dict({"world_size": 2, "device": "cpu"}), time_budget_s=0.2)
    loaded = ShardingPlan.from_json(plan.to_json())
    assert loaded.specs[0].hot_rows == ((0.01, 0.5), (0.5, 0.99))


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cli_writes_a_tables_file_that_plans_and_trains(tmp_path) -> None:
    out = tmp_path / "measured" / "tables" / "criteo_measured.yaml"
    done = run_cli("tables=criteo_small", "data=synthetic", "data.id_skew=1.1", "num_samples=3000", "batch_size=1024",
                   "exact_max_rows=50000", "sketch_rows=5000", f"out={out}", f"hot_ids={tmp_path / 'hot_ids.npz'}",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "access statistics per table" in done.stdout and "samples/s" in done.stdout
    specs, topology = load_tables_file(out)
    source, _ = load_tables_file(Path(CONFIG_DIR) / "tables" / "criteo_small.yaml")
    assert [(s.name, s.num_embeddings, s.embedding_dim) for s in specs] == [(s.name, s.num_embeddings, s.embedding_dim) for s in source]
    assert all(s.pooling_factor == 1.0 for s in specs)  # criteo_small: one id per bag
    big = next(s for s in specs if s.num_embeddings == 100_000)  # sketched (more rows than exact_max_rows)
    assert [f for f, _ in big.hot_rows] == list(HOT_FRACTIONS) and big.hot_rows[0][1] > 0.3  # skewed: far from uniform
    assert "sketch (D=" in done.stdout and "exact" in done.stdout

    user_dir = out.parent.parent
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        plan_cfg = compose("plan", overrides=[f"hydra.searchpath=[file://{user_dir}]", "tables=criteo_measured",
                                              "topology=cpu", "planner=quick", f"out={tmp_path / 'plan.json'}"])
        train_config.register()
        train_cfg = compose("train", overrides=[f"hydra.searchpath=[file://{user_dir}]", "tables=criteo_measured",
                                                f"out_dir={tmp_path / 'train'}"])
    plan_run(OmegaConf.to_container(plan_cfg, resolve=True), "criteo_measured", Console(file=io.StringIO()))
    plan = ShardingPlan.load(tmp_path / "plan.json")
    assert {s.name: s.hot_rows for s in plan.specs} == {s.name: s.hot_rows for s in specs}
    # hot ids: every table's hottest ids, as many as the planner may replicate (5%); the plan names the file
    # (a sketched table ranks only its heavy hitters: too few for the planner's 5%, which embshard-plan refuses)
    rankings = read_hot_ids(tmp_path / "hot_ids.npz", "test")
    exact = [s for s in specs if s.num_embeddings <= 50_000]
    assert {s.name: len(rankings[s.name]) for s in exact} == {s.name: max_hot_rows(s.num_embeddings) for s in exact}
    assert all(len(set(r.tolist())) == len(r) for r in rankings.values())
    assert 0 < len(rankings[big.name]) < max_hot_rows(big.num_embeddings)
    plan_cfg.hot_ids = str(tmp_path / "hot_ids.npz")
    with pytest.raises(ValueError, match=r"table 'cat_\d+' has \d+ ranked ids, the planner may replicate 5000"):
        plan_run(OmegaConf.to_container(plan_cfg, resolve=True), "criteo_measured", Console(file=io.StringIO()))
    rankings.update({s.name: np.arange(max_hot_rows(s.num_embeddings)) for s in specs if s.num_embeddings > 50_000})
    np.savez(tmp_path / "hot_ids.npz", **rankings)
    plan_run(OmegaConf.to_container(plan_cfg, resolve=True), "criteo_measured", Console(file=io.StringIO()))
    assert ShardingPlan.load(tmp_path / "plan.json").hot_ids_file == str((tmp_path / "hot_ids.npz").resolve())
    settings = train_config.settings_from_config(train_cfg)
    assert {s.name: s.hot_rows for s in settings.specs} == {s.name: s.hot_rows for s in specs}


def test_cli_refuses_bad_hot_rows_in_one_line(tmp_path) -> None:
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "bad.yaml").write_text(
        "# @package _global_\ntables:\n  - {name: t0, num_embeddings: 10, embedding_dim: 4, hot_rows: [[0.5, 0.9], [0.2, 0.95]]}\n")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):  # embshard-plan: the same check
        plan_cfg = compose("plan", overrides=[f"hydra.searchpath=[file://{tmp_path}]", "tables=bad", "topology=cpu"])
    with pytest.raises(ValueError, match=r"\(t0\)\.hot_rows\[1\]: fraction_of_rows 0.2 does not increase"):
        plan_run(OmegaConf.to_container(plan_cfg, resolve=True), "bad", Console(file=io.StringIO()))
    done = run_cli("--config-dir", str(tmp_path), "tables=bad", "num_samples=10", cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("embshard-stats: error: ") and "(t0).hot_rows[1]" in lines[0], done.stderr


def stream_curve(s: float, rows: int, fractions) -> np.ndarray:
    """The curve of embshard.data.synthetic.zipf_rows' law: the hottest x rows are the draws below x + 1 of a
    continuous power law on [1, rows + 1) (uniform for s = 0)."""
    x = np.asarray(fractions) * rows
    return x / rows if s == 0 else ((x + 1) ** (1 - s) - 1) / ((rows + 1) ** (1 - s) - 1)


# (exponent, rows, lookups, sketch_rows or 0 for exact counts): far more rows than lookups. The sample's own
# curve (the code before embshard.stats.tail) was off by 0.146, 0.390, 0.146 and 0.369 at worst of 0.1%/1%/10%
# (e.g. 1.0 at 1% for Zipf 1.1, where the stream gives 0.854: it reached 1 at the share of rows the lookups
# touched); the estimate is within 0.03 (measured: 0.002, 0.004, 0.002, 0.000).
SPARSE = [(1.1, 10_000_000, 200_000, 0), (0.8, 2_000_000, 100_000, 0), (1.1, 10_000_000, 200_000, 100_000), (0.0, 1_000_000, 300_000, 0)]


@pytest.mark.parametrize("s,rows,lookups,sketch_rows", SPARSE, ids=[f"s={s}-rows={r}-n={n}-sketch={k}" for s, r, n, k in SPARSE])
def test_curve_of_a_table_bigger_than_the_sample_extrapolates_its_tail(s: float, rows: int, lookups: int, sketch_rows: int) -> None:
    from embshard.data.synthetic import zipf_rows
    ids = zipf_rows(np.random.default_rng(3), rows, s, lookups, salt=11).astype(np.int64)
    counter = SketchCounter(rows, sketch_rows) if sketch_rows else ExactCounter(rows)
    for start in range(0, lookups, 50_000):
        counter.add(ids[start:start + 50_000])
    fractions = (0.001, 0.01, 0.1)
    np.testing.assert_allclose(counter.curve(fractions), stream_curve(s, rows, fractions), atol=0.03)
